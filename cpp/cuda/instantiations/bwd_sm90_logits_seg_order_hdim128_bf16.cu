// Hopper (wgmma) backward in deterministic mode with segment ids: soft-cap and / or ALiBi, or dropout alone (with or without masks), head dim 128, bf16. Built only when the archs include 90a.
#include "cuda/sm90/bwd_launch.cuh"

JAX_FLASH_INSTANTIATE_BWD_SM90_LOGITS_SEG_ORDER(kBFloat16, 128, false)
