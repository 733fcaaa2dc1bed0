// Split-KV decode kernels, head dim 256, bf16 (one unit per instantiation).
#include "cuda/decode/decode_launch_template.cuh"

JAX_FLASH_DECODE_INSTANTIATE(__nv_bfloat16, 256, false)
