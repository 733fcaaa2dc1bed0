// Timed configurations: the production dispatch plus alternative tile
// shapes (one per file under tune/ so they compile in parallel).
#include "cuda/launch.h"
#include "fwd_tune.h"

cudaError_t alt_d64_128x128x4w(const jax_flash::FwdParams&, cudaStream_t);
cudaError_t alt_d64_128x64x8w(const jax_flash::FwdParams&, cudaStream_t);
cudaError_t alt_d128_128x64x8w(const jax_flash::FwdParams&, cudaStream_t);
cudaError_t alt_d128_128x128x8w(const jax_flash::FwdParams&, cudaStream_t);
cudaError_t alt_d128_128x32x4w(const jax_flash::FwdParams&, cudaStream_t);
cudaError_t alt_d256_64x64x4w(const jax_flash::FwdParams&, cudaStream_t);

std::vector<TuneEntry> tune_entries() {
  return {
      {"default", 64, &jax_flash::cuda::run_fwd},
      {"default", 128, &jax_flash::cuda::run_fwd},
      {"default", 256, &jax_flash::cuda::run_fwd},
      {"d64_128x128x4w", 64, &alt_d64_128x128x4w},
      {"d64_128x64x8w", 64, &alt_d64_128x64x8w},
      {"d128_128x64x8w", 128, &alt_d128_128x64x8w},
      {"d128_128x128x8w", 128, &alt_d128_128x128x8w},
      {"d128_128x32x4w", 128, &alt_d128_128x32x4w},
      {"d256_64x64x4w", 256, &alt_d256_64x64x4w},
  };
}
