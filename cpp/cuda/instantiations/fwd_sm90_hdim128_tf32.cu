// Hopper warp-specialised (TMA + wgmma) forward instantiation: head dim 128, float32 on TF32. Built only when the archs include 90a.
#include "cuda/sm90/fwd_launch.cuh"

JAX_FLASH_INSTANTIATE_FWD_SM90_TF32(128)
