// Split-KV decode kernels, head dim 128, fp16 (one unit per instantiation).
#include "cuda/decode/decode_launch_template.cuh"

JAX_FLASH_DECODE_INSTANTIATE(__half, 128, false)
JAX_FLASH_DECODE_INSTANTIATE(__half, 128, true)  // paired d 64 heads
