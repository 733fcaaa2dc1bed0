// Host check of cpp/cuda/common/tile_order.h (plain C++, no GPU;
// tests/test_tile_order.py builds and runs it): tile_coord maps the grid onto
// every (tile, head, batch) exactly once for every order and direction;
// head-major is the kernels' original mapping; the sectioned order runs each
// section's tiles longest first over exactly its pairs. With arguments
// "fwd|bwd", seven sizes and a documents flag (segment ids: 0 / 1), prints
// fwd_order_group / bwd_order_group of that shape so the test can check what
// JAX_FLASH_FWD_ORDER / JAX_FLASH_BWD_ORDER select.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "cuda/common/tile_order.h"

using jax_flash::cuda::bwd_order_group;
using jax_flash::cuda::fwd_order_group;
using jax_flash::cuda::tile_coord;
using jax_flash::cuda::TileCoord;

static int check(int num_m, int heads, int batch, bool high_first, int group) {
  std::vector<int> seen(size_t(num_m) * heads * batch, 0);
  int bad = 0;
  auto fail = [&](const char* what, int bx, int by, int bz, TileCoord t) {
    if (bad++ < 5)
      std::printf("tiles=%d heads=%d batch=%d high_first=%d group=%d: %s at CTA (%d, %d, %d) -> (%d, %d, %d)\n",
                  num_m, heads, batch, int(high_first), group, what, bx, by, bz, t.tile, t.head, t.batch);
  };
  // rank: 0 for the longest tile.
  auto rank = [&](int tile) { return high_first ? num_m - 1 - tile : tile; };
  int prev_rank = -1, prev_section = -1;
  for (int bz = 0; bz < batch; ++bz)
    for (int by = 0; by < heads; ++by)
      for (int bx = 0; bx < num_m; ++bx) {
        const TileCoord t = tile_coord(bx, by, bz, num_m, heads, batch, high_first, group);
        if (t.tile < 0 || t.tile >= num_m || t.head < 0 || t.head >= heads || t.batch < 0 || t.batch >= batch) {
          fail("out of range", bx, by, bz, t);
          continue;
        }
        ++seen[(size_t(t.batch) * heads + t.head) * num_m + t.tile];
        if (group <= 0) {
          if (t.tile != rank(bx) || t.head != by || t.batch != bz) fail("not the original mapping", bx, by, bz, t);
          continue;
        }
        // Launch order: the pair's section, and tiles from the longest down
        // within it.
        const int pair = t.batch * heads + t.head;
        const int section = pair / group;
        if (section < prev_section) fail("section order", bx, by, bz, t);
        if (section == prev_section && rank(t.tile) < prev_rank) fail("longer tile after a shorter one", bx, by, bz, t);
        prev_section = section;
        prev_rank = rank(t.tile);
      }
  for (size_t i = 0; i < seen.size(); ++i)
    if (seen[i] != 1 && bad++ < 5)
      std::printf("tiles=%d heads=%d batch=%d high_first=%d group=%d: tile %zu computed %d times\n", num_m, heads,
                  batch, int(high_first), group, i, seen[i]);
  return bad;
}

int main(int argc, char** argv) {
  if (argc == 10) {  // fwd: num_m heads_q batch seqlen_k head_dim heads_kv bytes documents;
                     // bwd: key_tiles heads_kv batch seqlen_q head_dim heads_q bytes documents
    int a[8];
    for (int i = 0; i < 8; ++i) a[i] = std::atoi(argv[i + 2]);
    const bool fwd = std::strcmp(argv[1], "fwd") == 0;
    std::printf("%d\n", fwd ? fwd_order_group(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7] != 0)
                            : bwd_order_group(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7] != 0));
    return 0;
  }
  int bad = 0, cases = 0;
  const int ms[] = {1, 2, 7, 64, 129};
  const int heads[] = {1, 3, 16};
  const int batches[] = {1, 2, 5};
  const int groups[] = {0, 1, 2, 3, 4, 5, 16, 48, 1000};
  for (int m : ms)
    for (int h : heads)
      for (int b : batches)
        for (int high_first = 0; high_first < 2; ++high_first)
          for (int g : groups) {
            bad += check(m, h, b, high_first != 0, g);
            ++cases;
          }
  std::printf("tile order: %d cases, %d failures\n", cases, bad);
  return bad == 0 ? 0 : 1;
}
