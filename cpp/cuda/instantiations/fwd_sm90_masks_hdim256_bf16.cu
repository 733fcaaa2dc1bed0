// Hopper (wgmma) forward, masks-only variants: head dim 256, bf16. Built only when the archs include 90a.
#include "cuda/fwd_sm90_launch_template.cuh"

JAX_FLASH_INSTANTIATE_FWD_SM90_MASKS(kBFloat16, 256)
