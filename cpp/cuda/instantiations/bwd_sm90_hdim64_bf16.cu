// Hopper (wgmma) backward instantiation: head dim 64, bf16. Built only when the archs include 90a.
#include "cuda/sm90/bwd_launch.cuh"

JAX_FLASH_INSTANTIATE_BWD_SM90(kBFloat16, 64)
