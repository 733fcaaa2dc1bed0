// Split-KV decode kernels, head dim 256, fp16 (one unit per instantiation).
#include "cuda/decode/decode_launch_template.cuh"

JAX_FLASH_DECODE_INSTANTIATE(__half, 256, false)
