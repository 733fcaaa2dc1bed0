// Host check of cpp/cuda/tile_order.h (plain C++, no GPU; tests/test_tile_order.py
// builds and runs it): fwd_tile_coord maps the grid onto every (query tile,
// head, batch) exactly once for every order; head-major is the kernels'
// original mapping; the sectioned order runs each section's tiles longest
// first over exactly its pairs. With arguments (num_m heads_q batch seqlen_k
// head_dim heads_kv element_bytes), prints fwd_order_group of that shape so
// the test can check what JAX_FLASH_FWD_ORDER selects.
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cuda/tile_order.h"

using jax_flash::cuda::fwd_order_group;
using jax_flash::cuda::fwd_tile_coord;
using jax_flash::cuda::TileCoord;

static int check(int num_m, int heads, int batch, bool causal, int group) {
  std::vector<int> seen(size_t(num_m) * heads * batch, 0);
  int bad = 0;
  auto fail = [&](const char* what, int bx, int by, int bz, TileCoord t) {
    if (bad++ < 5)
      std::printf("num_m=%d heads=%d batch=%d causal=%d group=%d: %s at CTA (%d, %d, %d) -> (%d, %d, %d)\n", num_m,
                  heads, batch, int(causal), group, what, bx, by, bz, t.m_block, t.head, t.batch);
  };
  int prev_m = num_m, prev_section = -1;
  for (int bz = 0; bz < batch; ++bz)
    for (int by = 0; by < heads; ++by)
      for (int bx = 0; bx < num_m; ++bx) {
        const TileCoord t = fwd_tile_coord(bx, by, bz, num_m, heads, batch, causal, group);
        if (t.m_block < 0 || t.m_block >= num_m || t.head < 0 || t.head >= heads || t.batch < 0 || t.batch >= batch) {
          fail("out of range", bx, by, bz, t);
          continue;
        }
        ++seen[(size_t(t.batch) * heads + t.head) * num_m + t.m_block];
        if (!causal || group <= 0) {
          const int want_m = causal ? num_m - 1 - bx : bx;
          if (t.m_block != want_m || t.head != by || t.batch != bz) fail("not the original mapping", bx, by, bz, t);
          continue;
        }
        // Launch order: the pair's section, and query tiles non-increasing
        // within it.
        const int pair = t.batch * heads + t.head;
        const int section = pair / group;
        if (section < prev_section) fail("section order", bx, by, bz, t);
        if (section == prev_section && t.m_block > prev_m) fail("longer tile after a shorter one", bx, by, bz, t);
        if (section != prev_section) prev_m = num_m;
        prev_section = section;
        prev_m = t.m_block;
      }
  for (size_t i = 0; i < seen.size(); ++i)
    if (seen[i] != 1 && bad++ < 5)
      std::printf("num_m=%d heads=%d batch=%d causal=%d group=%d: tile %zu computed %d times\n", num_m, heads, batch,
                  int(causal), group, i, seen[i]);
  return bad;
}

int main(int argc, char** argv) {
  if (argc == 8) {
    int a[7];
    for (int i = 0; i < 7; ++i) a[i] = std::atoi(argv[i + 1]);
    std::printf("%d\n", fwd_order_group(a[0], a[1], a[2], a[3], a[4], a[5], a[6]));
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
        for (int causal = 0; causal < 2; ++causal)
          for (int g : groups) {
            bad += check(m, h, b, causal != 0, g);
            ++cases;
          }
  std::printf("tile order: %d cases, %d failures\n", cases, bad);
  return bad == 0 ? 0 : 1;
}
