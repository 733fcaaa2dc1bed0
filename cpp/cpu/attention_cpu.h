// CPU attention kernels: FlashAttention-2 on host memory, float32 accumulation.
#pragma once

#include <cstdint>
#include <functional>

#include "params.h"

namespace jax_flash::cpu {

// Runs body(i) for every i in [0, n) and returns when all are done. The FFI
// layer implements it on XLA's intra-op thread pool; the kernels only see this.
using ParallelFor = std::function<void(int64_t n, const std::function<void(int64_t)>& body)>;

// How work is spread: parallel_for plus the number of threads behind it (used
// to size the work split; 1 means run inline).
struct Executor {
  ParallelFor parallel_for;
  int num_threads = 1;
};

// o and lse from q, k, v. Q tiles outer, K/V tiles inner, online softmax.
void attention_fwd(const FwdParams& params, const Executor& exec);

// dq, dk, dv from q, k, v, o, lse, dout. P is recomputed tile by tile; dk/dv
// are reduced over each query-head group inside the kernel. Deterministic.
void attention_bwd(const BwdParams& params, const Executor& exec);

// Which instruction set the dispatcher picked ("avx512", "avx2" or "generic").
const char* isa_name();

}  // namespace jax_flash::cpu
