// Forward kernel instantiation: head dim 256, bf16. One per file so builds parallelise.
#include "cuda/sm80/fwd_launch_template.cuh"

JAX_FLASH_INSTANTIATE_FWD(kBFloat16, 256)
