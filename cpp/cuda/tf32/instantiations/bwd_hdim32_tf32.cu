// Float32 (TF32) backward, head dim 32.
#include "cuda/tf32/launch_template.cuh"
JAX_FLASH_INSTANTIATE_TF32_BWD(32)
