// Which (tile, head, batch) each CTA of a Hopper attention grid computes.
//
// The grids are (tiles, heads, batch): the forward's query tiles x q heads,
// the dK/dV kernel's key tiles x kv heads. The hardware hands CTAs out
// roughly in linear block order (x fastest). Causal tiles differ in work
// (forward query tile m visits ~m + 1 key tiles; backward key tile n sees the
// query tiles from n on), so the order decides the tail:
// - head-major: every (batch, head) pair in turn, its longest tile first.
//   The last pairs' longest tiles start late and run alone at the end.
// - sectioned longest-first (group > 0): pairs in sections of `group`; within
//   a section the tiles from the longest down, the section's pairs side by
//   side. A section's L2 working set (forward: K and V; backward: Q, dO and
//   the dQ accumulator) is sized to kL2Budget.
// A schedule model (benchmarks/schedule_model.py, NOTES "Causal forward: the
// tail of the launch order") put the head-major tail at 10-14% of causal
// forward time on the FA2 grid; on the H100 the sectioned order measured
// +5-8% causal forward and +2-6% forward+backward from 2k-4k tokens (d64,
// d128, d256), and -6% forward at 512 d128 (4 tiles a pair), so the default
// takes it from kAutoMinTiles tiles a pair on (NOTES, twelfth session).
// With segment ids (packed documents) a tile's work follows its place in
// its document, a sawtooth over the tile index, so longest-first by index
// launches the last section's later documents' longest tiles late (modelled
// tail at 16k: 6-9% backward, 8-20% forward with sequence-sized sections,
// 1-3% with every pair in one). A CTA's working set is then its documents'
// rows, so the sections are sized as if a pair held kDocRows rows: wider
// sections for long packed sequences, the same ones for sequences of at
// most kDocRows (with every pair in one section, 128 pairs of 2k tokens
// measured 1.27x instead of 1.05x plain causal forward+backward: L2).
// JAX_FLASH_FWD_ORDER / JAX_FLASH_BWD_ORDER (read once a process) pick the
// order of the causal forward / atomic-mode backward: "auto" (default),
// "heads", "lpt" (sections sized to kL2Budget) or "lpt:N" (sections of N
// pairs).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "host_device.h"

namespace jax_flash::cuda {

struct TileCoord {
  int tile, head, batch;
};

// CTA (bx, by, bz) of a (num_tiles, heads, batch) grid; high_first: tile
// num_tiles - 1 is the longest (the causal forward), else tile 0 (the causal
// backward). group 0: head-major. Bijective for every group >= 0
// (tests/cuda/tile_order_check.cc). The sectioned order counts in 32 bits:
// order_group keeps the grid below 2^31 CTAs and group at most the pairs.
JAX_FLASH_HD TileCoord tile_coord(int bx, int by, int bz, int num_tiles, int heads, int batch, bool high_first,
                                  int group) {
  if (group <= 0) return {high_first ? num_tiles - 1 - bx : bx, by, bz};
  const unsigned pairs = unsigned(heads) * unsigned(batch);
  const unsigned lin = unsigned(bx) + unsigned(num_tiles) * (unsigned(by) + unsigned(heads) * unsigned(bz));
  const unsigned first = lin / (unsigned(num_tiles) * unsigned(group)) * unsigned(group);  // the section's first pair
  const unsigned g = pairs - first < unsigned(group) ? pairs - first : unsigned(group);
  const unsigned within = lin - first * unsigned(num_tiles);
  const unsigned pair = first + within % g;
  const int rank = int(within / g);  // 0 = the longest tile
  return {high_first ? num_tiles - 1 - rank : rank, int(pair % unsigned(heads)), int(pair / unsigned(heads))};
}

// L2 bytes a section's pairs may keep (the H100 has 50 MB).
inline constexpr int64_t kL2Budget = int64_t(32) << 20;

// An order setting: kOrderAuto, kOrderHeads, 0 sections sized to kL2Budget,
// N > 0 sections of N pairs. Unset or unknown: kOrderAuto.
inline constexpr long kOrderAuto = -2, kOrderHeads = -1;
// kOrderAuto's threshold: grids of fewer tiles a pair stay head-major.
inline constexpr int64_t kAutoMinTiles = 8;

inline long parse_order(const char* s) {
  if (s != nullptr && std::strcmp(s, "heads") == 0) return kOrderHeads;
  if (s != nullptr && std::strcmp(s, "lpt") == 0) return 0;
  if (s != nullptr && std::strncmp(s, "lpt:", 4) == 0) {
    const long n = std::strtol(s + 4, nullptr, 10);
    if (n > 0) return n;
  }
  return kOrderAuto;
}

// Rows a pair's L2 working set is sized by with segment ids (a document
// length that packed training batches rarely exceed).
inline constexpr int64_t kDocRows = 4096;
// The rows of a pair's working set: its sequence, or with segment ids at
// most kDocRows.
inline int64_t pair_rows(int seqlen, bool documents) {
  return documents && seqlen > kDocRows ? kDocRows : seqlen;
}
// Section size in pairs for setting `mode` on a grid of num_tiles x pairs
// CTAs; pair_bytes: one pair's L2 working set. 0 = head-major.
inline int order_group(long mode, int64_t num_tiles, int64_t pairs, int64_t pair_bytes) {
  if (mode == kOrderAuto) mode = num_tiles >= kAutoMinTiles ? 0 : kOrderHeads;
  if (mode < 0 || pairs <= 0 || num_tiles * pairs >= (int64_t(1) << 31)) return 0;
  int64_t group = mode;
  if (group == 0) group = pair_bytes > 0 && pair_bytes < kL2Budget ? kL2Budget / pair_bytes : 1;
  return int(group < pairs ? group : pairs);
}

// The causal forward's grid (num_m query tiles, heads_q, batch): a pair's
// working set is its K and V; the q heads of one kv head share theirs.
inline int fwd_order_group(int num_m, int heads_q, int batch, int seqlen_k, int head_dim, int heads_kv,
                           int element_bytes, bool documents) {
  static const long mode = parse_order(std::getenv("JAX_FLASH_FWD_ORDER"));
  const int64_t group = heads_kv > 0 && heads_q >= heads_kv ? heads_q / heads_kv : 1;
  const int64_t rows = pair_rows(seqlen_k, documents);
  return order_group(mode, num_m, int64_t(heads_q) * batch, rows * head_dim * element_bytes * 2 / group);
}

// The atomic-mode dK/dV grid (key_tiles, heads_kv, batch): a pair's working
// set is its q heads' Q and dO and their float32 dQ accumulator.
inline int bwd_order_group(int key_tiles, int heads_kv, int batch, int seqlen_q, int head_dim, int heads_q,
                           int element_bytes, bool documents) {
  static const long mode = parse_order(std::getenv("JAX_FLASH_BWD_ORDER"));
  const int64_t group = heads_kv > 0 && heads_q >= heads_kv ? heads_q / heads_kv : 1;
  const int64_t rows = pair_rows(seqlen_q, documents);
  return order_group(mode, key_tiles, int64_t(heads_kv) * batch, rows * head_dim * group * (2 * element_bytes + 4));
}

}  // namespace jax_flash::cuda
