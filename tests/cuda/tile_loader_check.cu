// Host-only check (no GPU): TileLoader's shared-memory chunk addresses
// (cpp/cuda/tile_loader.cuh: the thread's first chunk plus compile-time
// offsets) equal those of CuTe's partition of the same tile, for every
// thread, chunk and stage of each Hopper tile configuration that uses it
// (the lockstep backward's Q / dO). CI builds and runs it where nvcc exists:
//   nvcc -std=c++17 --expt-relaxed-constexpr -I cpp -I <cutlass include> \
//     tests/cuda/tile_loader_check.cu -o /tmp/tile_loader_check && /tmp/tile_loader_check
#include <cstdio>
#include <vector>

#include "cuda/bwd_sm90_kernel.cuh"
#include "cuda/tile_loader.cuh"

using namespace jax_flash::cuda;
using namespace cute;

template <class E, class SmemLayout, class GmemCopy, int kRows, int kHeadDim, int kNThreads>
int check(const char* name) {
  using L = fwd::TileLoader<E, SmemLayout, kRows, kHeadDim, kNThreads>;
  static std::vector<char> buf(1 << 22);
  const uintptr_t b = (reinterpret_cast<uintptr_t>(buf.data()) + 4095) & ~uintptr_t(4095);
  Tensor s = make_tensor(make_smem_ptr(reinterpret_cast<E*>(b)), SmemLayout{});
  GmemCopy gcopy;
  int bad = 0, n = 0;
  for (int t = 0; t < kNThreads; ++t) {
    Tensor ts = gcopy.get_thread_slice(t).partition_D(s);
    static_assert(decltype(size<1>(ts))::value == L::kM && decltype(size<2>(ts))::value == L::kK);
    const int r = t / L::kThreadsPerRow, c = 8 * (t % L::kThreadsPerRow);
    for (int m = 0; m < L::kM; ++m)
      for (int k = 0; k < L::kK; ++k)
        for (int st = 0; st < 2; ++st) {
          const uintptr_t want = reinterpret_cast<uintptr_t>(&ts(0, m, k, st)) - b;
          const uintptr_t got = uintptr_t(L::byte_offset(r, c, 0) + L::chunk_offset(m, k, st));
          ++n;
          if (want != got && bad++ < 5)
            printf("%s t=%d m=%d k=%d stage=%d: CuTe %lu, loader %lu\n", name, t, m, k, st, (unsigned long)want,
                   (unsigned long)got);
        }
  }
  printf("%s: %d chunks, %d mismatches\n", name, n, bad);
  return bad;
}

template <class Traits>
int check_bwd(const char* name) {
  return check<typename Traits::Element, typename Traits::SmemLayoutQ, typename Traits::GmemCopyIn, Traits::kBlockM,
               Traits::kHeadDim, Traits::kNThreads>(name);
}

int main() {
  using bf = cutlass::bfloat16_t;
  using fp = cutlass::half_t;
  int bad = 0;
  bad += check_bwd<bwd90::BwdSm90Traits<64, bf, true, false, false, 128>>("bwd d64 BM128");
  bad += check_bwd<bwd90::BwdSm90Traits<128, bf, true, false, false, 64>>("bwd d128 BM64");
  bad += check_bwd<bwd90::BwdSm90Traits<128, fp, true, false, false, 64>>("bwd d128 BM64 fp16");
  printf(bad ? "FAILED\n" : "all chunk addresses agree\n");
  return bad != 0;
}
