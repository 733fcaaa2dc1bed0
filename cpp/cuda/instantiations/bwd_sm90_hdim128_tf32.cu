// Hopper TF32 wgmma backward (float32: dK / dV and dQ kernels): head dim 128. Built only when the archs include 90a.
#include "cuda/sm90/bwd_tf32_launch.cuh"

JAX_FLASH_INSTANTIATE_BWD_SM90_TF32(128)
