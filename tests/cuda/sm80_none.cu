// Stand-ins for the SM80 forward when fwd_sm90_harness is built without it
// (Makefile.sm90 SM80=0): the sm90 cases and timings need none of it, and
// its twelve units are most of the build time.
#include "cuda/launch.h"
#include "fwd_tune.h"

namespace jax_flash::cuda {
cudaError_t run_fwd(const FwdParams&, cudaStream_t) { return cudaErrorNotSupported; }
}  // namespace jax_flash::cuda

std::vector<TuneEntry> tune_entries() { return {}; }
