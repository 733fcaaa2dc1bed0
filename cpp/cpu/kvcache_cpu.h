// CPU kernels of attention_with_kvcache (see kvcache_params.h for the
// semantics): the append of new keys/values into the cache, and the
// attention itself, split over key ranges and merged in float32.
#pragma once

#include "cpu/attention_cpu.h"
#include "kvcache_params.h"

namespace jax_flash::cpu {

// Writes k_new/v_new at positions raw_length(b) - seqlen_q + i of the cache
// (in place); rows past the capacity or in an out-of-range page are dropped.
void kvcache_append(const KvcacheParams& params);

// o and lse from q and the cache (after any append). Parallel over
// (batch, kv head, key split); every q head of a kv group shares the
// converted K/V block.
void kvcache_attention(const KvcacheParams& params, const Executor& exec);

}  // namespace jax_flash::cpu
