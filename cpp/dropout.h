// The dropout keep mask, one definition for every target: Philox4x32-10
// (Salmon et al., SC'11) keyed by the two seed words. One call yields 8
// 16-bit draws: element (b, h, i, j) takes the (i / 8) % 2 half (0: low) of
// word j % 4 of philox(key, {j / 4, dropout_row_pair(i), h, b}), so rows i
// and i + 8 of every 16-row block share a call, as they share the registers
// of one MMA accumulator thread; it is kept when that draw >=
// dropout_threshold(rate) (a keep probability of 1 - threshold / 65536, the
// rate rounded to 1/65536). Host and device compile the same code, so CPU and
// CUDA drop the same elements; jax_flash.dropout_mask mirrors it in jnp.
#pragma once

#include <cstdint>

#include "host_device.h"

namespace jax_flash {

struct Philox4 {
  uint32_t x, y, z, w;
};

JAX_FLASH_HD void mulhilo32(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
#if defined(__CUDA_ARCH__)
  hi = __umulhi(a, b);
  lo = a * b;
#else
  const uint64_t p = uint64_t(a) * uint64_t(b);
  hi = uint32_t(p >> 32);
  lo = uint32_t(p);
#endif
}

JAX_FLASH_HD Philox4 philox4x32_10(Philox4 c, uint32_t k0, uint32_t k1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int r = 0; r < 10; ++r) {
    uint32_t hi0, lo0, hi1, lo1;
    mulhilo32(kM0, c.x, hi0, lo0);
    mulhilo32(kM1, c.z, hi1, lo1);
    c = Philox4{hi1 ^ c.y ^ k0, lo1, hi0 ^ c.w ^ k1, lo0};
    k0 += kW0;
    k1 += kW1;
  }
  return c;
}

// Draws below the threshold are dropped: P(keep) = 1 - threshold / 65536
// (65536: every element dropped).
JAX_FLASH_HD uint32_t dropout_threshold(float rate) {
  const double t = double(rate) * 65536.0 + 0.5;
  return t >= 65536.0 ? 65536u : uint32_t(t);
}

// The counter's row word: rows i and i + 8 of a 16-row block map to one.
JAX_FLASH_HD uint32_t dropout_row_pair(int row) {
  return (uint32_t(row) >> 4 << 3) | (uint32_t(row) & 7u);
}

// The four words of keys [4 * (col / 4), 4 * (col / 4) + 4) for rows
// {row, row ^ 8} (row's half: (row >> 3) & 1).
JAX_FLASH_HD Philox4 dropout_words(const uint32_t seed[2], int batch, int head, int row, int col) {
  return philox4x32_10(Philox4{uint32_t(col) >> 2, dropout_row_pair(row), uint32_t(head), uint32_t(batch)},
                       seed[0], seed[1]);
}

JAX_FLASH_HD uint32_t philox_word(const Philox4& w, int i) {
  return i == 0 ? w.x : i == 1 ? w.y : i == 2 ? w.z : w.w;
}

// Row `row`'s 16-bit draw in word w.
JAX_FLASH_HD uint32_t dropout_draw(uint32_t w, int row) {
  return (row & 8) ? w >> 16 : w & 0xFFFFu;
}

// One element's keep bit (reference code; the kernels share calls).
JAX_FLASH_HD bool dropout_keep(const uint32_t seed[2], int batch, int head, int row, int col, uint32_t threshold) {
  return dropout_draw(philox_word(dropout_words(seed, batch, head, row, col), col & 3), row) >= threshold;
}

}  // namespace jax_flash
