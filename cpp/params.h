// The one contract between the FFI layer and the kernels: raw pointers,
// element strides and sizes. Kernels never see XLA or nanobind types.
#pragma once

#include <cstddef>
#include <cstdint>

namespace jax_flash {

enum class DType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

// Layout is BTNH: q [batch, seqlen_q, heads_q, head_dim], k/v [batch,
// seqlen_k, heads_kv, head_dim]. Strides are in elements and int64 so that
// index products never overflow. The last (head_dim) stride is always 1.
struct FwdParams {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* o = nullptr;      // same dtype and strides layout as q
  float* lse = nullptr;   // [batch, heads_q, seqlen_q], natural log

  int64_t q_batch_stride = 0, q_row_stride = 0, q_head_stride = 0;
  int64_t k_batch_stride = 0, k_row_stride = 0, k_head_stride = 0;
  int64_t v_batch_stride = 0, v_row_stride = 0, v_head_stride = 0;
  int64_t o_batch_stride = 0, o_row_stride = 0, o_head_stride = 0;
  // lse is always contiguous [batch, heads_q, seqlen_q].

  int batch = 0;
  int seqlen_q = 0;
  int seqlen_k = 0;
  int heads_q = 0;
  int heads_kv = 0;   // heads_q % heads_kv == 0; q head h reads kv head h / (heads_q / heads_kv)
  int head_dim = 0;

  float scale = 0.f;  // softmax scale applied to q.k
  bool causal = false;  // top-left aligned: query i sees keys j <= i
  DType dtype = DType::kFloat32;

  int group_size() const { return heads_q / heads_kv; }
};

// Backward: inputs of the forward plus o, lse and the incoming cotangent do;
// outputs dq (like q) and dk, dv (like k, v: never heads_q-sized).
struct BwdParams : FwdParams {
  const void* dout = nullptr;
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;

  int64_t do_batch_stride = 0, do_row_stride = 0, do_head_stride = 0;
  int64_t dq_batch_stride = 0, dq_row_stride = 0, dq_head_stride = 0;
  int64_t dk_batch_stride = 0, dk_row_stride = 0, dk_head_stride = 0;
  int64_t dv_batch_stride = 0, dv_row_stride = 0, dv_head_stride = 0;

  // Device scratch for the CUDA backward (float32 dq accumulator, rowsum
  // D = rowsum(dO * O), ...), sized by cuda::bwd_workspace_bytes(params) and
  // handed over by the FFI layer. Unused on the CPU.
  void* workspace = nullptr;
  bool deterministic = false;  // CUDA: no atomics, bitwise reproducible
};

}  // namespace jax_flash
