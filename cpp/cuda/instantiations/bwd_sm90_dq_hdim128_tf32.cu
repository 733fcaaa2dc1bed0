// Hopper TF32 wgmma dQ kernel instantiation (float32 backward): head dim 128. Built only when the archs include 90a.
#include "cuda/sm90/bwd_dq_tf32_launch.cuh"

JAX_FLASH_INSTANTIATE_BWD_SM90_DQ_TF32(128)
