// Host-only check (no GPU): KVTileLoader's shared-memory chunk addresses
// (cpp/cuda/kv_tile_loader.cuh: the thread's first chunk plus compile-time
// offsets) equal those of CuTe's partition of the same tile, for every thread,
// chunk and stage of each Hopper forward tile configuration. CI builds and
// runs it where nvcc exists:
//   nvcc -std=c++17 --expt-relaxed-constexpr -I cpp -I <cutlass include> \
//     tests/cuda/kv_tile_loader_check.cu -o /tmp/kv_check && /tmp/kv_check
#include <cstdio>
#include <vector>
#include "cuda/fwd_sm90_kernel.cuh"
#include "cuda/kv_tile_loader.cuh"
using namespace jax_flash::cuda::fwd;
template <class Traits>
int check(const char* name) {
  using E = typename Traits::Element;
  using L = KVTileLoader<E, typename Traits::SmemLayoutKV, Traits::kBlockN, Traits::kHeadDim, Traits::kNThreads>;
  static std::vector<char> buf(1 << 22);
  uintptr_t b = (reinterpret_cast<uintptr_t>(buf.data()) + 4095) & ~uintptr_t(4095);
  E* base = reinterpret_cast<E*>(b);
  Tensor sK = make_tensor(make_smem_ptr(base), typename Traits::SmemLayoutKV{});
  typename Traits::GmemCopyIn gcopy;
  int bad = 0, n = 0;
  for (int t = 0; t < Traits::kNThreads; ++t) {
    Tensor tKs = gcopy.get_thread_slice(t).partition_D(sK);
    static_assert(decltype(size<1>(tKs))::value == L::kM && decltype(size<2>(tKs))::value == L::kK);
    const int r = t / L::kThreadsPerRow, c = 8 * (t % L::kThreadsPerRow);
    for (int m = 0; m < L::kM; ++m)
      for (int k = 0; k < L::kK; ++k)
        for (int s = 0; s < 2; ++s) {
          const uintptr_t want = reinterpret_cast<uintptr_t>(&tKs(0, m, k, s)) - b;
          const uintptr_t got = uintptr_t(L::byte_offset(r, c, 0) + L::chunk_offset(m, k, s));
          ++n;
          if (want != got && bad++ < 5) printf("%s t=%d m=%d k=%d s=%d want %lu got %lu\n", name, t, m, k, s, (unsigned long)want, (unsigned long)got);
        }
  }
  printf("%s: %d chunks, %d mismatches (kM=%d kK=%d rows/pass=%d)\n", name, n, bad, L::kM, L::kK, L::kRowsPerPass);
  return bad;
}
int main() {
  using bf = cutlass::bfloat16_t;
  int bad = 0;
  bad += check<Sm90Traits<64, 128, bf, false, true, 2>>("d64 BN128");
  bad += check<Sm90Traits<64, 64, bf, false, true, 2, 2, true>>("d64 BN64");
  bad += check<Sm90Traits<128, 64, bf, false, true, 2>>("d128 BN64");
  bad += check<Sm90Traits<256, 64, bf, true, false, 1>>("d256 BN64");
  bad += check<Sm90Traits<128, 64, cutlass::half_t, false, true, 2>>("d128 fp16");
  return bad != 0;
}
