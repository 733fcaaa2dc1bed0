// Hopper warp-specialised forward, dropout with soft-cap and / or ALiBi (with or without masks): head dim 256, fp16. Built only when the archs include 90a.
#include "cuda/sm90/fwd_launch.cuh"

JAX_FLASH_INSTANTIATE_FWD_SM90_LOGITS_DROPOUT(kFloat16, 256)
