// Hopper warp-specialised forward, masks-only variants: head dim 256, fp16. Built only when the archs include 90a.
#include "cuda/sm90/fwd_launch.cuh"

JAX_FLASH_INSTANTIATE_FWD_SM90_MASKS(kFloat16, 256)
