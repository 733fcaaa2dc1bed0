// Forward kernel instantiation: head dim 224, fp16. One per file so builds parallelise.
#include "cuda/sm80/fwd_launch_template.cuh"

JAX_FLASH_INSTANTIATE_FWD(kFloat16, 224)
