// Hopper (wgmma) backward instantiation: head dim 256, bf16 (wide-head kernel). Built only when the archs include 90a.
#include "cuda/sm90/bwd_wide_launch.cuh"

JAX_FLASH_INSTANTIATE_BWD_SM90_WIDE(kBFloat16, 256)
