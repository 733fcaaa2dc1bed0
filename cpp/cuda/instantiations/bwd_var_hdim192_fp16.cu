// Backward variants kernels (window, lengths, segments, soft-cap, ALiBi, dropout):
// head dim 192, fp16. Own build unit so it compiles in parallel with the plain one.
#include "cuda/sm80/bwd_launch_template.cuh"

JAX_FLASH_INSTANTIATE_BWD_VARIANTS(kFloat16, 192)
