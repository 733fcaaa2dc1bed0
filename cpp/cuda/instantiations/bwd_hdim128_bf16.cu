// Backward kernel instantiation: head dim 128, bf16. One per file so builds parallelise.
#include "cuda/sm80/bwd_launch_template.cuh"

JAX_FLASH_INSTANTIATE_BWD(kBFloat16, 128)
