// Harness-only configurations of the Hopper backward (d128), beside the
// default (dQ by bulk reduce copies):
//   dqatomic  v1: per-element fp32 float2 atomics for dQ (kDqBulk = false)
//   earlydv   dV wgmma issued before the dS math (kEarlyDv = true)
//   lateloads next tile's loads issued behind the S/dP wgmmas (kLateLoads)
#include "cuda/bwd_sm90_launch_template.cuh"

namespace jf = jax_flash::cuda;

template <bool kBulk, bool kEarlyDv, bool kLate = false>
static cudaError_t launch_alt(const jax_flash::BwdParams& p, jf::BwdLaunchFlags f, cudaStream_t s) {
  if (p.dtype == jax_flash::DType::kFloat16)
    return jf::bwd90::launch_bwd_sm90<jf::bwd90::BwdSm90Traits<128, cutlass::half_t, kBulk, kEarlyDv, kLate>>(p, f, s);
  return jf::bwd90::launch_bwd_sm90<jf::bwd90::BwdSm90Traits<128, cutlass::bfloat16_t, kBulk, kEarlyDv, kLate>>(p, f, s);
}

cudaError_t bwd_sm90_d128_dqatomic(const jax_flash::BwdParams& p, jf::BwdLaunchFlags f, cudaStream_t s) {
  return launch_alt<false, false>(p, f, s);
}
cudaError_t bwd_sm90_d128_earlydv(const jax_flash::BwdParams& p, jf::BwdLaunchFlags f, cudaStream_t s) {
  return launch_alt<true, true>(p, f, s);
}
cudaError_t bwd_sm90_d128_lateloads(const jax_flash::BwdParams& p, jf::BwdLaunchFlags f, cudaStream_t s) {
  return launch_alt<true, false, true>(p, f, s);
}
