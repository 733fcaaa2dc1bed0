// Float32 (TF32) forward, head dim 64.
#include "cuda/tf32/launch_template.cuh"
JAX_FLASH_INSTANTIATE_TF32_FWD(64)
