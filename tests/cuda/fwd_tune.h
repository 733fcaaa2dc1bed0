// Forward configurations timed by the harness: the production dispatch plus
// alternative tile shapes (defined in fwd_tune.cu).
#pragma once

#include <vector>

#include <cuda_runtime_api.h>

#include "params.h"

using TuneFn = cudaError_t (*)(const jax_flash::FwdParams&, cudaStream_t);
struct TuneEntry {
  const char* name;
  int head_dim;
  TuneFn fn;
};
std::vector<TuneEntry> tune_entries();
