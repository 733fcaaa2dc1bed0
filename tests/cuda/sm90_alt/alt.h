// Alternative Hopper forward configurations timed (and tested) by
// fwd_sm90_harness. Each sm90_alt/*.cu registers itself here, so the
// Makefile's ALTS list alone decides which ones a build carries.
#pragma once

#include <vector>

#include "fwd_tune.h"

struct Sm90Alt {
  const char* name;
  int d;
  TuneFn fn;
};
std::vector<Sm90Alt>& sm90_alts();  // defined in fwd_sm90_harness.cu

struct Sm90AltRegister {
  Sm90AltRegister(const char* name, int d, TuneFn fn) { sm90_alts().push_back({name, d, fn}); }
};

// One configuration per unit: NAME the C identifier, LABEL what the bench
// prints, CFG a Sm90Traits alias (no commas inside a macro argument).
#define SM90_ALT(NAME, LABEL, CFG)                                                              \
  static cudaError_t NAME(const jax_flash::FwdParams& p, cudaStream_t s) {                       \
    return jax_flash::cuda::fwd::launch_fwd_sm90<CFG>(p, s);                                     \
  }                                                                                             \
  static Sm90AltRegister NAME##_reg(LABEL, CFG::kHeadDim, &NAME);
