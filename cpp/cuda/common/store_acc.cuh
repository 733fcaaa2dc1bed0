// Fragment -> global store of an fp32 accumulator as 16-bit elements: the
// dK / dV / dQ epilogues of the SM80 and the Hopper backwards.
#pragma once

#include <cstdint>

#include <cute/tensor.hpp>

namespace jax_flash::cuda::bwd {

using namespace cute;

template <class Element>
__device__ __forceinline__ uint32_t pack2(float a, float b) {
  Element lo(a), hi(b);
  return uint32_t(lo.raw()) | (uint32_t(hi.raw()) << 16);
}

// Store an fp32 accumulator tile (times `mul`) to a row-major global tile,
// predicated on rows_valid / cols_valid. `coords` is the partitioned
// identity tensor of the accumulator. pair_ok: 4-byte stores are legal.
template <class Element, class Acc, class Coords>
__device__ __forceinline__ void store_acc(Acc const& acc, Coords const& coords, Element* g,
                                          int64_t row_stride, int rows_valid, int cols_valid,
                                          float mul, bool pair_ok) {
  CUTE_UNROLL
  for (int i = 0; i < size(acc); i += 2) {
    const int r = get<0>(coords(i));
    const int c = get<1>(coords(i));
    if (r < rows_valid) {
      Element* dst = g + r * row_stride + c;
      if (pair_ok && c + 1 < cols_valid) {
        *reinterpret_cast<uint32_t*>(dst) = pack2<Element>(acc(i) * mul, acc(i + 1) * mul);
      } else {
        if (c < cols_valid) dst[0] = Element(acc(i) * mul);
        if (c + 1 < cols_valid) dst[1] = Element(acc(i + 1) * mul);
      }
    }
  }
}

}  // namespace jax_flash::cuda::bwd
