// Bulk async copies and reductions from shared to global memory (sm90) and
// the gpu-scope counters deterministic mode
// orders the copies with; the Hopper backward kernels add their dQ tiles to
// the float32 accumulator with these.
#pragma once

#include <cstdint>

namespace jax_flash::cuda::sm90 {

// global += shared (f32), `bytes` a multiple of 16; joins the open bulk group.
__device__ __forceinline__ void bulk_reduce_add_f32(float* gmem, const float* smem, int bytes) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(gmem), "r"(s),
               "r"(bytes)
               : "memory");
}
// global = shared, `bytes` a multiple of 16; joins the open bulk group.
__device__ __forceinline__ void bulk_store(void* gmem, const void* smem, int bytes) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(gmem), "r"(s), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// Wait until the committed groups have read shared memory / have completed.
__device__ __forceinline__ void bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }
__device__ __forceinline__ void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }

__device__ __forceinline__ int load_acquire(const int* ptr) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(ptr) : "memory");
  return v;
}
__device__ __forceinline__ void add_release(int* ptr, int v) {
  asm volatile("red.release.gpu.global.add.s32 [%0], %1;\n" ::"l"(ptr), "r"(v) : "memory");
}
// Waits until *counter >= target (acquire), backing off 32 to 256 ns: a
// lane spinning flat out took issue slots from the consumer warp beside it
// on its SM sub-partition.
__device__ __forceinline__ void wait_count(const int* counter, int target) {
  for (unsigned ns = 32; load_acquire(counter) < target; ns = ns < 256 ? 2 * ns : ns) __nanosleep(ns);
}
// Orders the generic-proxy accesses around it with the bulk copies (async proxy).
__device__ __forceinline__ void fence_async_global() { asm volatile("fence.proxy.async.global;\n" ::: "memory"); }

// Deterministic mode's ordered adds, as the dQ writers take them: wait for
// the tile's counter to reach this CTA's rank, the read ordered before the
// bulk copies that follow; then, once every bulk copy issued has landed,
// count this CTA's add.
__device__ __forceinline__ void wait_turn(const int* counter, int rank) {
  wait_count(counter, rank);
  fence_async_global();
}
__device__ __forceinline__ void count_landed(int* counter) {
  bulk_wait_all();
  fence_async_global();
  add_release(counter, 1);
}

}  // namespace jax_flash::cuda::sm90
