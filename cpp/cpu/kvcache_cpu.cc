// CPU attention_with_kvcache: one task per (batch, kv head, key split); each
// task converts a block of cache rows to float32 once and scores it against
// every query row of the kv group (q heads x seqlen_q), keeping an online
// softmax per row. Splits are merged by their (max, sum) in float32.
#define JF_ISA_NS kvcache_generic
#include "cpu/kvcache_cpu.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "cpu/tile_math.h"

namespace jax_flash::cpu {
namespace {

using kvcache_generic::bf16;
using kvcache_generic::f16;
using kvcache_generic::to_float;

constexpr int kKeyBlock = 32;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

template <class T>
void append_impl(const KvcacheParams& p) {
  const int64_t d = p.head_dim;
  const T* kn = static_cast<const T*>(p.k_new);
  const T* vn = static_cast<const T*>(p.v_new);
  T* kc = static_cast<T*>(p.k_cache);
  T* vc = static_cast<T*>(p.v_cache);
  for (int b = 0; b < p.batch; ++b) {
    const int64_t pos0 = p.raw_length(b) - p.seqlen_q;
    for (int i = 0; i < p.seqlen_q; ++i) {
      const int64_t pos = pos0 + i;
      if (pos < 0 || pos >= p.capacity()) continue;
      for (int h = 0; h < p.heads_kv; ++h) {
        const int64_t dst = p.cache_offset(b, pos, h);
        if (dst < 0) continue;
        const int64_t src = ((int64_t(b) * p.seqlen_q + i) * p.heads_kv + h) * d;
        std::memcpy(kc + dst, kn + src, sizeof(T) * d);
        std::memcpy(vc + dst, vn + src, sizeof(T) * d);
      }
    }
  }
}

// Per-row state of one split: running max m (of the final logits), sum l,
// and the unnormalised output acc[head_dim].
struct RowState {
  float m, l;
};

template <class T>
void attend_impl(const KvcacheParams& p, const Executor& exec) {
  const int G = p.group_size(), sq = p.seqlen_q, d = p.head_dim;
  const int R = G * sq;  // query rows per (batch, kv head): r = g * sq + i
  const int64_t cap = p.capacity();
  const int64_t base = int64_t(p.batch) * p.heads_kv;
  // Enough tasks for the threads, each split at least 256 keys.
  int64_t splits = std::max<int64_t>(1, (4 * exec.num_threads + base - 1) / base);
  splits = std::min<int64_t>({splits, std::max<int64_t>(1, cap / 256), 64});
  const int64_t S = splits;
  std::vector<float> acc(size_t(S * base * R) * d);
  std::vector<RowState> st(size_t(S * base * R));
  const T* q = static_cast<const T*>(p.q);
  const T* kc = static_cast<const T*>(p.k_cache);
  const T* vc = static_cast<const T*>(p.v_cache);
  const float log2e = 1.4426950408889634f;

  exec.parallel_for(S * base, [&](int64_t task) {
    const int64_t s = task % S, bh = task / S;
    const int b = int(bh / p.heads_kv), hk = int(bh % p.heads_kv);
    const int64_t L = p.length(b), pos0 = p.query_start(b);
    // Keys any row of the group may see.
    const int64_t lo = std::max<int64_t>(0, p.first_key(pos0));
    const int64_t hi = std::min<int64_t>(L, p.last_key(pos0 + sq - 1) + 1);
    const int64_t chunk = hi > lo ? (hi - lo + S - 1) / S : 0;
    const int64_t k0 = lo + s * chunk, k1 = std::min(hi, k0 + chunk);
    float* my_acc = &acc[size_t((s * base + bh) * R) * d];
    RowState* my_st = &st[size_t((s * base + bh) * R)];
    std::fill(my_acc, my_acc + size_t(R) * d, 0.f);
    for (int r = 0; r < R; ++r) my_st[r] = {kNegInf, 0.f};
    if (k0 >= k1) return;

    std::vector<float> qf(size_t(R) * d), kf(size_t(kKeyBlock) * d), vf(size_t(kKeyBlock) * d);
    std::vector<float> slope(R, 0.f);
    for (int r = 0; r < R; ++r) {
      const int g = r / sq, i = r % sq, h = hk * G + g;
      const T* src = q + ((int64_t(b) * sq + i) * p.heads_q + h) * d;
      for (int c = 0; c < d; ++c) qf[size_t(r) * d + c] = to_float(src[c]);
      if (p.alibi_slopes) slope[r] = p.alibi_slopes[b * p.alibi_batch_stride + h];
    }
    bool valid[kKeyBlock];
    float sc[kKeyBlock];
    for (int64_t j0 = k0; j0 < k1; j0 += kKeyBlock) {
      const int n = int(std::min<int64_t>(kKeyBlock, k1 - j0));
      for (int t = 0; t < n; ++t) {
        const int64_t off = p.cache_offset(b, j0 + t, hk);
        valid[t] = off >= 0;
        for (int c = 0; c < d; ++c) {
          kf[size_t(t) * d + c] = valid[t] ? to_float(kc[off + c]) : 0.f;
          vf[size_t(t) * d + c] = valid[t] ? to_float(vc[off + c]) : 0.f;
        }
      }
      for (int r = 0; r < R; ++r) {
        const int64_t pos = pos0 + r % sq;
        const int64_t first = p.first_key(pos), last = p.last_key(pos);
        float bmax = kNegInf;
        for (int t = 0; t < n; ++t) {
          const int64_t j = j0 + t;
          if (!valid[t] || j < first || j > last) {
            sc[t] = kNegInf;
            continue;
          }
          float x = 0.f;
          const float* qr = &qf[size_t(r) * d];
          const float* kr = &kf[size_t(t) * d];
          for (int c = 0; c < d; ++c) x += qr[c] * kr[c];
          x *= p.scale;
          if (p.softcap > 0.f) x = p.softcap * std::tanh(x / p.softcap);
          if (p.alibi_slopes) x -= slope[r] * float(pos > j ? pos - j : j - pos);
          sc[t] = x;
          bmax = std::max(bmax, x);
        }
        if (bmax == kNegInf) continue;
        RowState& rs = my_st[r];
        const float m_new = std::max(rs.m, bmax);
        const float corr = rs.m == kNegInf ? 0.f : std::exp2((rs.m - m_new) * log2e);
        float* ar = &my_acc[size_t(r) * d];
        for (int c = 0; c < d; ++c) ar[c] *= corr;
        float lsum = 0.f;
        for (int t = 0; t < n; ++t) {
          if (sc[t] == kNegInf) continue;
          const float e = std::exp2((sc[t] - m_new) * log2e);
          lsum += e;
          const float* vr = &vf[size_t(t) * d];
          for (int c = 0; c < d; ++c) ar[c] += e * vr[c];
        }
        rs.l = rs.l * corr + lsum;
        rs.m = m_new;
      }
    }
  });

  // Merge the splits of each row into o and lse.
  T* o = static_cast<T*>(p.o);
  exec.parallel_for(base, [&](int64_t bh) {
    const int b = int(bh / p.heads_kv), hk = int(bh % p.heads_kv);
    std::vector<float> out(d);
    for (int r = 0; r < R; ++r) {
      const int g = r / sq, i = r % sq, h = hk * G + g;
      float m = kNegInf;
      for (int64_t s = 0; s < S; ++s) m = std::max(m, st[size_t((s * base + bh) * R + r)].m);
      float l = 0.f;
      std::fill(out.begin(), out.end(), 0.f);
      if (m != kNegInf) {
        for (int64_t s = 0; s < S; ++s) {
          const RowState rs = st[size_t((s * base + bh) * R + r)];
          if (rs.m == kNegInf) continue;
          const float w = std::exp2((rs.m - m) * log2e);
          l += rs.l * w;
          const float* a = &acc[size_t((s * base + bh) * R + r) * d];
          for (int c = 0; c < d; ++c) out[c] += w * a[c];
        }
      }
      const float inv = l > 0.f ? 1.f / l : 0.f;
      T* dst = o + ((int64_t(b) * sq + i) * p.heads_q + h) * d;
      for (int c = 0; c < d; ++c) dst[c] = kvcache_generic::from_float<T>(out[c] * inv);
      p.lse[(int64_t(b) * p.heads_q + h) * sq + i] = l > 0.f ? m + std::log(l) : kNegInf;
    }
  });
}

}  // namespace

void kvcache_append(const KvcacheParams& p) {
  switch (p.dtype) {
    case DType::kFloat32: return append_impl<float>(p);
    case DType::kFloat16: return append_impl<f16>(p);
    case DType::kBFloat16: return append_impl<bf16>(p);
  }
}

void kvcache_attention(const KvcacheParams& p, const Executor& exec) {
  switch (p.dtype) {
    case DType::kFloat32: return attend_impl<float>(p, exec);
    case DType::kFloat16: return attend_impl<f16>(p, exec);
    case DType::kBFloat16: return attend_impl<bf16>(p, exec);
  }
}

}  // namespace jax_flash::cpu
