// What the compute-sanitizer drivers share: CHECK(expr), which on a CUDA
// error prints it with the place and returns 1 from the calling function;
// device copies of host vectors; segment ids with their 16-block ranges;
// a case's options set on the kernel parameters.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include <cuda_runtime_api.h>

#include "params.h"

#define CHECK(x)                                                                           \
  do {                                                                                     \
    cudaError_t e_ = (x);                                                                  \
    if (e_ != cudaSuccess) {                                                               \
      std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
      return 1;                                                                            \
    }                                                                                      \
  } while (0)

// Device copy of host words (freed by the caller).
template <class T>
static T* upload_vec(const std::vector<T>& h) {
  void* d = nullptr;
  if (cudaMalloc(&d, h.size() * sizeof(T)) != cudaSuccess ||
      cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice) != cudaSuccess)
    return nullptr;
  return static_cast<T*>(d);
}

// Device copy of a host int32 vector (freed by the caller).
static int32_t* upload_ints(const std::vector<int32_t>& h) {
  void* d = nullptr;
  if (cudaMalloc(&d, h.size() * 4) != cudaSuccess ||
      cudaMemcpy(d, h.data(), h.size() * 4, cudaMemcpyHostToDevice) != cudaSuccess)
    return nullptr;
  return static_cast<int32_t*>(d);
}

// Segment ids in runs of doc tokens and their per-16-block [min, max].
static void segments(int b, int s, int doc, std::vector<int32_t>& ids, std::vector<int32_t>& ranges) {
  constexpr int kB = jax_flash::FwdParams::kSegmentBlock;
  const int nblk = (s + kB - 1) / kB;
  ids.assign(size_t(b) * s, 0);
  ranges.assign(size_t(b) * nblk * 2, 0);
  for (int bb = 0; bb < b; ++bb) {
    for (int i = 0; i < s; ++i) ids[size_t(bb) * s + i] = (i + 37 * bb) / doc;
    for (int k = 0; k < nblk; ++k) {
      ranges[(size_t(bb) * nblk + k) * 2] = ids[size_t(bb) * s + k * kB];
      ranges[(size_t(bb) * nblk + k) * 2 + 1] = ids[size_t(bb) * s + std::min(s, (k + 1) * kB) - 1];
    }
  }
}

// The options a driver's case asks for (window, lengths, segment ids,
// soft-cap, ALiBi, dropout: fields window, lengths, doc, softcap, alibi,
// dropout, b, sq, sk, hq) set on p, their device buffers appended to
// `owned` (freed by the caller). Returns false if an upload failed.
template <class Case, class Params>
static bool set_options(const Case& c, Params& p, std::vector<void*>& owned) {
  bool ok = true;
  auto keep = [&](void* ptr) {
    ok = ok && ptr != nullptr;
    owned.push_back(ptr);
    return ptr;
  };
  auto ints = [&](const std::vector<int32_t>& h) { return static_cast<const int32_t*>(keep(upload_ints(h))); };
  if (c.window >= 0) p.window_left = c.window;
  if (c.lengths) {
    std::vector<int32_t> ql(c.b), kl(c.b);
    for (int bb = 0; bb < c.b; ++bb) ql[bb] = std::max(0, c.sq - 7 * bb), kl[bb] = std::max(0, c.sk - 5 * bb);
    p.q_seqlens = ints(ql);
    p.kv_seqlens = ints(kl);
  }
  if (c.doc > 0) {
    std::vector<int32_t> ids, ranges;
    segments(c.b, c.sq, c.doc, ids, ranges);
    p.q_segment_ids = ints(ids);
    p.q_segment_ranges = ints(ranges);
    segments(c.b, c.sk, c.doc, ids, ranges);
    p.kv_segment_ids = ints(ids);
    p.kv_segment_ranges = ints(ranges);
  }
  p.softcap = c.softcap;
  if (c.alibi) {
    std::vector<float> slopes(c.hq);
    for (int h = 0; h < c.hq; ++h) slopes[h] = 0.5f / float(h + 1);
    p.alibi_slopes = static_cast<const float*>(keep(upload_vec(slopes)));
  }
  if (c.dropout > 0.f) {
    p.dropout_seed = static_cast<const uint32_t*>(keep(upload_vec(std::vector<uint32_t>{0x1234u, 0xBEEFu})));
    p.dropout_rate = c.dropout;
  }
  return ok;
}
