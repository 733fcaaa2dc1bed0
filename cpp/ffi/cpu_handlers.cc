// XLA FFI handlers for the CPU kernels. Work is spread over XLA's intra-op
// thread pool; the calling thread takes part, so the handler finishes even if
// the pool never runs a task.
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>

#include "cpu/attention_cpu.h"
#include "ffi/common.h"
#include "ffi/cpu_executor.h"
#include "ffi/handlers.h"

namespace jax_flash::ffi_glue {
namespace {

// Shared state of one parallel_for; tasks that start after the work ran out
// only touch this (kept alive by shared_ptr), never the caller's stack.
struct ForState {
  explicit ForState(int64_t n) : n(n) {}
  const int64_t n;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
  std::mutex mu;
  std::condition_variable cv;

  // Claims and runs items until none are left.
  void drain(const std::function<void(int64_t)>& body) {
    int64_t finished = 0;
    for (int64_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) {
      body(i);
      ++finished;
    }
    if (finished && done.fetch_add(finished) + finished == n) {
      std::lock_guard<std::mutex> lock(mu);
      cv.notify_all();
    }
  }
};

cpu::Executor make_executor(ffi::ThreadPool& pool) {
  cpu::Executor exec;
  exec.num_threads = int(std::max<int64_t>(1, pool.num_threads()));
  exec.parallel_for = [&pool, threads = exec.num_threads](
                          int64_t n, const std::function<void(int64_t)>& body) {
    if (n <= 0) return;
    if (threads <= 1 || n == 1) {
      for (int64_t i = 0; i < n; ++i) body(i);
      return;
    }
    auto state = std::make_shared<ForState>(n);
    // `body` lives on the caller's stack: helpers copy it into the task only
    // while the caller is guaranteed to be waiting (it waits for done == n,
    // and a helper that claims no item never calls it).
    auto shared_body = std::make_shared<std::function<void(int64_t)>>(body);
    const int64_t helpers = std::min<int64_t>(threads, n) - 1;
    for (int64_t t = 0; t < helpers; ++t)
      pool.Schedule([state, shared_body] { state->drain(*shared_body); });
    state->drain(body);
    std::unique_lock<std::mutex> lock(state->mu);
    state->cv.wait(lock, [&] { return state->done.load() == state->n; });
  };
  return exec;
}

ffi::Error FwdCpu(ffi::ThreadPool pool, ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                  ffi::RemainingArgs extra, ffi::Result<ffi::AnyBuffer> o, ffi::Result<ffi::Buffer<ffi::F32>> lse,
                  ffi::Result<ffi::AnyBuffer> /*scheduler scratch: CUDA only*/,
                  float scale, bool causal, int64_t query_offset, int64_t window_left,
                  int64_t window_right, float softcap, float dropout_rate,
                  int64_t optional_inputs, bool f32_full) {
  FwdParams p;
  if (auto e = fill_fwd(p, q, k, v, extra, o->untyped_data(), lse->typed_data(), scale,
                         {causal, query_offset, window_left, window_right, softcap, dropout_rate,
                          optional_inputs, f32_full});
      e.failure())
    return e;
  if (!same_shape(q, *o)) return mismatch("o must be shaped like q", q, *o);
  cpu::attention_fwd(p, make_executor(pool));
  return ffi::Error::Success();
}

ffi::Error BwdCpu(ffi::ThreadPool pool, ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                  ffi::AnyBuffer o, ffi::Buffer<ffi::F32> lse, ffi::AnyBuffer dout,
                  ffi::RemainingArgs extra, ffi::Result<ffi::AnyBuffer> dq, ffi::Result<ffi::AnyBuffer> dk,
                  ffi::Result<ffi::AnyBuffer> dv, ffi::Result<ffi::AnyBuffer> /*workspace: CUDA only*/,
                  float scale, bool causal, int64_t query_offset, int64_t window_left,
                  int64_t window_right, float softcap, float dropout_rate,
                  int64_t optional_inputs, bool f32_full, bool deterministic) {
  BwdParams p;
  if (auto e = fill_bwd(p, q, k, v, o, lse, dout, extra, *dq, *dk, *dv, scale,
                         {causal, query_offset, window_left, window_right, softcap, dropout_rate,
                          optional_inputs, f32_full}, deterministic);
      e.failure())
    return e;
  cpu::attention_bwd(p, make_executor(pool));
  return ffi::Error::Success();
}

}  // namespace

cpu::Executor cpu_executor(ffi::ThreadPool& pool) { return make_executor(pool); }

}  // namespace jax_flash::ffi_glue

namespace ffi = xla::ffi;

XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_flash_fwd_cpu, jax_flash::ffi_glue::FwdCpu,
                              jax_flash::ffi_glue::bind_fwd(
                                  ffi::Ffi::Bind().Ctx<ffi::ThreadPool>()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_flash_bwd_cpu, jax_flash::ffi_glue::BwdCpu,
                              jax_flash::ffi_glue::bind_bwd(
                                  ffi::Ffi::Bind().Ctx<ffi::ThreadPool>()));
