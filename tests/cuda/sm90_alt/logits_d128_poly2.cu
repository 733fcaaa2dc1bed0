// Alternative Hopper logits configuration (fwd_sm90_harness --logits): head
// dim 128, default logits tiles, one softmax exp2 in 2 of the soft-cap
// kernels on the FMA pipe (kPolyExp2 2); ALiBi alone: the default kernel.
#include "cuda/fwd_sm90_launch_template.cuh"
#include "alt.h"

// The default kernels come from the fwd_sm90_logits_hdim128_* units.
extern template cudaError_t jax_flash::cuda::run_fwd_sm90_logits_hdim<jax_flash::DType::kBFloat16, 128>(
    const jax_flash::FwdParams&, cudaStream_t);
extern template cudaError_t jax_flash::cuda::run_fwd_sm90_logits_hdim<jax_flash::DType::kFloat16, 128>(
    const jax_flash::FwdParams&, cudaStream_t);

namespace {
namespace jf = jax_flash::cuda;
template <jax_flash::DType T>
cudaError_t run(const jax_flash::FwdParams& p, cudaStream_t s) {
  if (!(p.softcap > 0.f)) return jf::run_fwd_sm90_logits_hdim<T, 128>(p, s);
  return jf::fwd::launch_fwd_sm90_logits<jf::fwd::Sm90MasksTraits<128, T>, jf::fwd::Sm90LogitsBothMasksTraits<128, T>, 2>(p, s);
}
cudaError_t sm90_logits_d128_poly2(const jax_flash::FwdParams& p, cudaStream_t s) {
  return p.dtype == jax_flash::DType::kFloat16 ? run<jax_flash::DType::kFloat16>(p, s) : run<jax_flash::DType::kBFloat16>(p, s);
}
Sm90AltRegister reg("logits poly2", 128, &sm90_logits_d128_poly2);
}  // namespace
