// Timed configurations when the tune/ alternatives are not built (NO_TUNE=1).
#include "cuda/launch.h"
#include "fwd_tune.h"

std::vector<TuneEntry> tune_entries() {
  return {{"default", 64, &jax_flash::cuda::run_fwd},
          {"default", 128, &jax_flash::cuda::run_fwd},
          {"default", 256, &jax_flash::cuda::run_fwd}};
}
