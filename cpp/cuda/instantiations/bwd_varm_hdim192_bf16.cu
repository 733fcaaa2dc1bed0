// Backward masks-only variants kernels (window, lengths, offsets, segments):
// head dim 192, bf16. Own build unit so it compiles in parallel with the others.
#include "cuda/sm80/bwd_launch_template.cuh"

JAX_FLASH_INSTANTIATE_BWD_VARIANTS_MASKS(kBFloat16, 192)
