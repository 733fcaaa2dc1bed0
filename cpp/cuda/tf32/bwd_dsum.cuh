// Backward preprocess for float32: D = rowsum(dO * O) per (batch, head,
// query row), one warp a row, into the workspace.
#pragma once

#include <cstdint>

#include "params.h"

namespace jax_flash::cuda::tf32 {

// A template (on the element type, float) so that every unit including this
// header gets its own instance rather than a duplicate strong symbol.
template <class Element>
__global__ void __launch_bounds__(256) bwd_dsum_kernel(const BwdParams p, float* __restrict__ dsum) {
  const int lane = threadIdx.x % 32;
  const int64_t rows = int64_t(p.batch) * p.heads_q * p.seqlen_q;
  const int64_t nwarps = int64_t(gridDim.x) * blockDim.x / 32;
  const Element* o = static_cast<const Element*>(p.o);
  const Element* dout = static_cast<const Element*>(p.dout);
  for (int64_t r = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32; r < rows; r += nwarps) {
    const int64_t bh = r / p.seqlen_q;
    const int b = int(bh / p.heads_q), h = int(bh % p.heads_q), i = int(r % p.seqlen_q);
    const Element* orow = o + b * p.o_batch_stride + int64_t(i) * p.o_row_stride + h * p.o_head_stride;
    const Element* drow = dout + b * p.do_batch_stride + int64_t(i) * p.do_row_stride + h * p.do_head_stride;
    float acc = 0.f;
    for (int e = lane; e < p.head_dim; e += 32) acc += float(orow[e]) * float(drow[e]);
#pragma unroll
    for (int off = 16; off > 0; off /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off);
    if (lane == 0) dsum[r] = acc;
  }
}

}  // namespace jax_flash::cuda::tf32
