// The producer / consumer handshakes of the warp-specialised Hopper kernels:
// mbarrier stages (full: the TMA bytes landed; empty: every consumer thread
// let go of the buffer) and the named barriers that order the consumer
// warpgroups' wgmma issue (ping-pong).
#pragma once

#include <cstdint>

#include <cutlass/arch/barrier.h>

namespace jax_flash::cuda::sm90 {

// Position in a ring of kStages buffers: the index and the parity of the
// mbarrier phase a wait on it means. Consumers start at phase 0 (wait for
// the first fill); the producer starts at phase 1, which a fresh empty
// barrier already satisfies (every buffer starts free).
template <int kStages>
struct RingState {
  int index = 0;
  uint32_t phase = 0;
  __device__ __forceinline__ void advance() {
    if (++index == kStages) {
      index = 0;
      phase ^= 1u;
    }
  }
};

using cutlass::arch::ClusterBarrier;
using cutlass::arch::ClusterTransactionBarrier;

__device__ __forceinline__ void barrier_init(uint64_t& bar, uint32_t count) { ClusterBarrier::init(&bar, count); }
__device__ __forceinline__ void barrier_wait(uint64_t& bar, uint32_t phase) { ClusterBarrier::wait(&bar, phase); }
__device__ __forceinline__ void barrier_arrive(uint64_t& bar) { ClusterBarrier::arrive(&bar); }
// The producer's arrival on a full barrier, announcing the bytes its TMA
// copies will complete on it.
__device__ __forceinline__ void barrier_expect_bytes(uint64_t& bar, uint32_t bytes) {
  ClusterTransactionBarrier::arrive_and_expect_tx(&bar, bytes);
}

// Named barriers 1.. (0 is __syncthreads). A warpgroup waits on its own and
// signals the other's: only one consumer warpgroup issues wgmmas at a time,
// so one's softmax runs under the other's matrix products.
__device__ __forceinline__ void named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

}  // namespace jax_flash::cuda::sm90
