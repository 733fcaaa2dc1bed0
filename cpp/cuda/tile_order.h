// Which (query tile, head, batch) each CTA of the forward grid computes.
//
// The grid is (query tiles, heads, batch) and the hardware hands CTAs out
// roughly in linear block order (x fastest). Causal tiles differ in work
// (query tile m visits ~m + 1 key tiles), so the order decides the tail:
// - kHeadMajor (default): every (batch, head) in turn, its longest tile
//   first. Its last heads' longest tiles start late and run alone at the end.
// - sectioned longest-first (group > 0, causal only): (batch, head) pairs in
//   sections of `group`; within a section, query tiles from the longest down,
//   the section's pairs side by side. A section's K / V (group x seqlen_k x
//   head_dim x 2) is sized to stay in L2 while its tiles run.
// A schedule model (benchmarks/NOTES.md, "Causal forward: the tail") puts the
// head-major tail at 10-14% of causal forward time on the FA2 grid and the
// sectioned order at 0-3%. JAX_FLASH_FWD_ORDER picks the order at run time
// (read once): "heads" (default), "lpt" (sections sized to kL2Budget), or
// "lpt:N" (sections of N pairs), for A/B runs on the device.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>

#if defined(__CUDACC__)
#define JAX_FLASH_HD __host__ __device__ __forceinline__
#else
#define JAX_FLASH_HD inline
#endif

namespace jax_flash::cuda {

struct TileCoord {
  int m_block, head, batch;
};

// CTA (bx, by, bz) of a (num_m, heads, batch) grid. Bijective for any
// group >= 0 (tests/cuda/tile_order_check.cc). The sectioned order counts in
// 32 bits: fwd_order_group keeps the grid below 2^31 CTAs and group at
// most the pairs.
JAX_FLASH_HD TileCoord fwd_tile_coord(int bx, int by, int bz, int num_m, int heads, int batch, bool causal,
                                      int group) {
  if (!causal) return {bx, by, bz};
  if (group <= 0) return {num_m - 1 - bx, by, bz};
  const unsigned pairs = unsigned(heads) * unsigned(batch);
  const unsigned lin = unsigned(bx) + unsigned(num_m) * (unsigned(by) + unsigned(heads) * unsigned(bz));
  const unsigned first = lin / (unsigned(num_m) * unsigned(group)) * unsigned(group);  // the section's first pair
  const unsigned g = pairs - first < unsigned(group) ? pairs - first : unsigned(group);
  const unsigned within = lin - first * unsigned(num_m);
  const unsigned pair = first + within % g;
  return {num_m - 1 - int(within / g), int(pair % unsigned(heads)), int(pair / unsigned(heads))};
}

// Bytes of K and V that a section may keep in L2 (the H100 has 50 MB).
inline constexpr int64_t kL2Budget = int64_t(32) << 20;

// Host: the forward's section size, in (batch, head) pairs, for a grid of
// (num_m, heads_q, batch) CTAs over K / V of seqlen_k x head_dim; 0 =
// head-major. At most every pair; 0 for grids of 2^31 CTAs or more (the
// kernel's 32-bit count).
inline int fwd_order_group(int num_m, int heads_q, int batch, int seqlen_k, int head_dim, int heads_kv,
                           int element_bytes) {
  static const long mode = [] {  // -1: heads; 0: lpt sized to L2; N > 0: lpt:N
    const char* s = std::getenv("JAX_FLASH_FWD_ORDER");
    if (s != nullptr && std::strcmp(s, "lpt") == 0) return 0L;
    if (s != nullptr && std::strncmp(s, "lpt:", 4) == 0) {
      const long n = std::strtol(s + 4, nullptr, 10);
      if (n > 0) return n;
    }
    return -1L;
  }();
  const int64_t pairs = int64_t(heads_q) * batch;
  if (mode < 0 || pairs <= 0 || int64_t(num_m) * pairs >= (int64_t(1) << 31)) return 0;
  int64_t group = mode;
  if (group == 0) {
    const int64_t kv_head = int64_t(seqlen_k) * head_dim * element_bytes * 2;
    const int64_t kv_heads = kv_head > 0 && kv_head < kL2Budget ? kL2Budget / kv_head : 1;
    group = kv_heads * (heads_kv > 0 && heads_q >= heads_kv ? heads_q / heads_kv : 1);
  }
  return int(group < pairs ? group : pairs);
}

}  // namespace jax_flash::cuda

#undef JAX_FLASH_HD
