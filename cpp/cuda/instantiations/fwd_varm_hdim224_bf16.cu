// Forward masks-only variants kernel (window, lengths, offsets, segments):
// head dim 224, bf16. Own build unit so it compiles in parallel with the others.
#define JAX_FLASH_FWD_VARM_UNIT
#include "cuda/sm80/fwd_var_launch_template.cuh"

JAX_FLASH_INSTANTIATE_FWD_VARIANTS_MASKS(kBFloat16, 224)
