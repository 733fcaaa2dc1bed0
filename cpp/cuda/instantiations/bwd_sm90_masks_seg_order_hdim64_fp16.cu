// Hopper (wgmma) backward, masks-only variants in deterministic mode with segment ids: head dim 64, fp16. Built only when the archs include 90a.
#include "cuda/sm90/bwd_launch.cuh"

JAX_FLASH_INSTANTIATE_BWD_SM90_MASKS_SEG_ORDER(kFloat16, 64)
