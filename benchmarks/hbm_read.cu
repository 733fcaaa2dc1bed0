// The HBM read ceiling that the decode figures are set against: the best
// GB/s a plain streaming read reaches on this GPU, for buffers the size of
// bench_decode.py's K+V (128 MB to 2 GB), over a sweep of launch shapes:
//   - grid-stride: CTAs x threads interleaved over the whole buffer, four
//     16-byte loads in flight a thread;
//   - chunks: one contiguous range a CTA (how a split-KV decode CTA reads its
//     keys), eight 16-byte loads in flight a thread.
// Two buffers are read in turn, so no launch finds the last one's bytes in
// L2. Loads are ld.global.nc with no L1 allocation; nothing is written.
//
//   nvcc -O3 -arch=native benchmarks/hbm_read.cu -o /tmp/hbm_read && /tmp/hbm_read [out.json]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#define CHECK(x)                                                            \
  do {                                                                      \
    cudaError_t e_ = (x);                                                   \
    if (e_ != cudaSuccess) {                                                \
      std::fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_));         \
      return 1;                                                             \
    }                                                                       \
  } while (0)

__device__ __forceinline__ uint4 load_stream(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// The XOR of everything read feeds a store that never happens (the value is
// not the sentinel), so the loads cannot be dropped.
constexpr unsigned kSentinel = 0x9e3779b9u;

__global__ void grid_stride_read(const uint4* __restrict__ p, size_t n, unsigned* sink) {
  constexpr int kUnroll = 4;
  unsigned acc = 0;
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  for (; i + (kUnroll - 1) * stride < n; i += kUnroll * stride) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = load_stream(p + i + u * stride);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < n; i += stride) {
    const uint4 v = load_stream(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == kSentinel) *sink = acc;
}

__global__ void chunk_read(const uint4* __restrict__ p, size_t per_cta, unsigned* sink) {
  constexpr int kUnroll = 8;
  unsigned acc = 0;
  const uint4* base = p + blockIdx.x * per_cta;
  for (size_t i = threadIdx.x; i < per_cta; i += kUnroll * blockDim.x) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const size_t j = i + u * blockDim.x;
      v[u] = j < per_cta ? load_stream(base + j) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  if (acc == kSentinel) *sink = acc;
}

// Median milliseconds of `reps` launches of f(buffer index), after one warm-up.
template <class F>
float median_ms(F f, int reps) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  std::vector<float> t;
  f(0);
  cudaDeviceSynchronize();
  for (int r = 0; r < reps; ++r) {
    cudaEventRecord(a);
    f(r & 1);
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms = 0.f;
    cudaEventElapsedTime(&ms, a, b);
    t.push_back(ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

int main(int argc, char** argv) {
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s: %d SMs, L2 %d MB\n", prop.name, sms, prop.l2CacheSize >> 20);
  unsigned* sink = nullptr;
  CHECK(cudaMalloc(&sink, sizeof(unsigned)));
  std::string json = "[";
  const size_t mb = size_t(1) << 20;
  for (size_t bytes : {128 * mb, 512 * mb, 1024 * mb, 2048 * mb}) {
    uint4* buf[2];
    CHECK(cudaMalloc(&buf[0], bytes));
    CHECK(cudaMalloc(&buf[1], bytes));
    CHECK(cudaMemset(buf[0], 1, bytes));
    CHECK(cudaMemset(buf[1], 2, bytes));
    const size_t n = bytes / sizeof(uint4);
    float best = 0.f;
    char best_shape[64] = "";
    auto keep = [&](float gbps, const char* kind, int ctas, int threads) {
      if (gbps > best) {
        best = gbps;
        std::snprintf(best_shape, sizeof best_shape, "%s %d CTAs x %d", kind, ctas, threads);
      }
    };
    for (int threads : {256, 512, 1024}) {
      for (int per_sm : {1, 2, 4, 8}) {
        if (threads * per_sm > 2048) continue;
        const int ctas = sms * per_sm;
        const float ms = median_ms([&](int i) { grid_stride_read<<<ctas, threads>>>(buf[i], n, sink); }, 21);
        keep(bytes / ms / 1e6f, "grid-stride", ctas, threads);
      }
    }
    for (int ctas : {sms * 2, 256, 512, 1024, 2048}) {
      for (int threads : {128, 256}) {
        const size_t per = n / ctas;
        const float ms = median_ms([&](int i) { chunk_read<<<ctas, threads>>>(buf[i], per, sink); }, 21);
        keep(per * ctas * sizeof(uint4) / ms / 1e6f, "chunks", ctas, threads);
      }
    }
    CHECK(cudaGetLastError());
    // Device-to-device copy of half a buffer: bytes read plus bytes written.
    const float copy_ms = median_ms(
        [&](int i) { cudaMemcpyAsync(buf[i], buf[i ^ 1], bytes / 2, cudaMemcpyDeviceToDevice); }, 21);
    const float copy = bytes / copy_ms / 1e6f;
    std::printf("%5zu MB: read %.0f GB/s (%s); copy %.0f GB/s read+written\n", bytes / mb, best, best_shape,
                copy);
    char rec[512];
    std::snprintf(rec, sizeof rec,
                  "%s{\"device\": \"%s\", \"bytes\": %zu, \"read_gbps\": %.1f, \"read_shape\": \"%s\", "
                  "\"copy_gbps\": %.1f}",
                  json.size() > 1 ? ",\n " : "", prop.name, bytes, best, best_shape, copy);
    json += rec;
    CHECK(cudaFree(buf[0]));
    CHECK(cudaFree(buf[1]));
  }
  json += "]\n";
  if (argc > 1) {
    FILE* f = std::fopen(argv[1], "w");
    if (f == nullptr) {
      std::fprintf(stderr, "cannot write %s\n", argv[1]);
      return 1;
    }
    std::fputs(json.c_str(), f);
    std::fclose(f);
  }
  return 0;
}
