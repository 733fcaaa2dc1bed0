#!/usr/bin/env bash
# One device call: build with CUDA, run the GPU tests, the sanitizers and the
# benchmark, keeping logs and JSON under $OUT (the device machine keeps nothing).
#   bash benchmarks/gpu_session.sh [build] [test] [sanitize] [bench] [bench-grid] [bench-quick] [bench-float32]
#     [smoke] [test-decode] [sanitize-decode] [bench-decode] [bench-generate] [ncu-decode] [order]
#     [ncu-packed] [ncu-packed-bwd] [ncu-options] [ncu-grid] [pack]
# sanitize runs every tests/cuda/sanitize*.sh (sanitize_sm90.sh: the warp-specialised forward and backward).
# JAX_FLASH_CUDA_ARCHS=90a builds for the H100 alone (half the compile time).
# Needs the nvidia-cutlass wheel in .whl/ (carried; see README "Building for GPU").
set -uo pipefail
OUT=${OUT:-/tmp/jf_out}
mkdir -p "$OUT"
stages=${*:-build test sanitize bench}
export PYTHONUNBUFFERED=1

if [ -d .whl ] && ! python3 -c "import cutlass_library" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
# Records are named for the GPU they ran on (h100_decode.json, h200_decode.json, ...).
gpu_tag=$(head -1 "$OUT/gpu.txt" | grep -oiE '\b[a-z][0-9]{2,4}\b' | head -1 | tr 'A-Z' 'a-z')
gpu_tag=${gpu_tag:-gpu}

for stage in $stages; do
  case $stage in
    build)
      start=$(date +%s)
      JAX_FLASH_CUDA=1 CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
        python3 -m pip install --no-build-isolation --no-deps -v . >"$OUT/build.log" 2>&1
      rc=$?
      echo "build rc=$rc in $(( $(date +%s) - start )) s on $(nproc) cores" | tee -a "$OUT/summary.txt"
      [ $rc -eq 0 ] || { tail -50 "$OUT/build.log"; exit 1; }
      # Per-unit compile times (ninja log: start, end in ms), longest first.
      for f in build/*/.ninja_log; do
        [ -f "$f" ] && awk 'NR > 1 { printf "%7.1f s  %s\n", ($2 - $1) / 1000, $4 }' "$f" | sort -rn >"$OUT/compile_times.txt"
      done
      head -5 "$OUT/compile_times.txt" 2>/dev/null
      (cd /tmp && python3 -m jax_flash --no-timing) 2>&1 | tee "$OUT/selfcheck.txt" | tail -8
      ;;
    test)
      # XLA autotuning of the jnp references costs ~15 s a test; the kernels need none.
      # Most of a GPU test's time is XLA compiling references on the host: TEST_WORKERS=N
      # runs N pytest-xdist processes sharing the GPU (no memory preallocation).
      # PYTEST_K: a -k expression (e.g. "not fp16" for a JAX_FLASH_CUDA_DTYPES=bf16 build).
      par=""
      if [ -n "${TEST_WORKERS:-}" ]; then
        par="-n $TEST_WORKERS"
        export XLA_PYTHON_CLIENT_PREALLOCATE=false
      fi
      XLA_FLAGS="${XLA_FLAGS:---xla_gpu_autotune_level=0}" timeout ${TEST_TIMEOUT:-400} python3 -P -m pytest -m gpu $par -q -rfE --durations=10 ${PYTEST_K:+-k "$PYTEST_K"} ${TESTS:-tests} 2>&1 \
        | tee "$OUT/pytest_gpu.log" | tail -25
      ;;
    sanitize)
      for s in tests/cuda/sanitize*.sh; do
        [ -f "$s" ] && timeout 300 bash "$s" >"$OUT/$(basename "$s" .sh).log" 2>&1
        echo "$s rc=$?" | tee -a "$OUT/summary.txt"
      done
      ;;
    bench)
      python3 benchmarks/bench_attention.py --out "$OUT/bench.json" 2>&1 | tee "$OUT/bench.log"
      ;;
    bench-grid)  # the anchors' seqlens (1k, 4k, 16k) for every head dim, each point's best of RUNS (2)
      timeout ${BENCH_TIMEOUT:-600} python3 benchmarks/bench_attention.py --seqlens 1024 4096 16384 \
        --runs ${RUNS:-2} --out "$OUT/bench_grid.json" 2>&1 | tee "$OUT/bench_grid.log"
      ;;
    bench-float32)  # float32 (TF32 kernels) vs jax.nn xla float32, forward and forward+backward
      timeout ${BENCH_TIMEOUT:-600} python3 -P benchmarks/bench_float32.py --out "$OUT/bench_float32.json" \
        2>&1 | tee "$OUT/bench_float32.log" | tail -20
      ;;
    smoke)  # what a new user runs first on a GPU with defaults: the README's GPU commands (the
            # self-check), the demo (short; bf16 default and --dtype float32), the Flax GPU tests
      run_smoke() {
        local name=$1; shift
        timeout ${SMOKE_TIMEOUT:-300} "$@" >"$OUT/smoke_$name.log" 2>&1
        echo "smoke $name rc=$?" | tee -a "$OUT/summary.txt"
        tail -${SMOKE_TAIL:-6} "$OUT/smoke_$name.log"
      }
      (cd /tmp && run_smoke selfcheck python3 -m jax_flash)
      run_smoke demo python3 -P -m jax_flash.demo --steps ${SMOKE_STEPS:-60} --no-plot
      run_smoke demo_f32 python3 -P -m jax_flash.demo --steps ${SMOKE_STEPS:-60} --no-plot --dtype float32
      run_smoke flax_gpu python3 -P -m pytest -m gpu -q -rfE tests/test_flax_gpu.py tests/test_cuda_float32.py -k "nnx or flax or linen"
      ;;
    bench-quick)
      python3 benchmarks/bench_attention.py --head-dims 128 --seqlens 1024 4096 16384 \
        --out "$OUT/bench_quick.json" 2>&1 | tee "$OUT/bench_quick.log"
      ;;
    ncu-packed)  # where the packed-documents forward loses time against its equal-work unpacked batch
      timeout ${NCU_TIMEOUT:-300} ncu --clock-control none --kernel-name regex:fwd_ws_kernel --section SpeedOfLight --section LaunchStats \
        --section WarpStateStats --section SchedulerStats --section SourceCounters -f -o "$OUT/packed" \
        python3 -P benchmarks/prof_packed.py >"$OUT/ncu_packed.log" 2>&1
      echo "ncu-packed rc=$?" | tee -a "$OUT/summary.txt"
      ncu --import "$OUT/packed.ncu-rep" --page details --csv >"$OUT/packed_details.csv" 2>&1
      ncu --import "$OUT/packed.ncu-rep" --page source --csv --print-source sass 2>&1 | gzip >"$OUT/packed_source.csv.gz"
      rm -f "$OUT/packed.ncu-rep"
      ;;
    ncu-packed-bwd)  # the same for the packed backward's dK/dV kernel (bench_variants' documents: seed 0)
      timeout ${NCU_TIMEOUT:-300} ncu --clock-control none --kernel-name regex:bwd_sm90_dkdv_kernel --section SpeedOfLight \
        --section LaunchStats --section WarpStateStats --section SchedulerStats --section SourceCounters \
        -f -o "$OUT/packed_bwd" python3 -P benchmarks/prof_packed.py --backward --seed 0 >"$OUT/ncu_packed_bwd.log" 2>&1
      echo "ncu-packed-bwd rc=$?" | tee -a "$OUT/summary.txt"
      ncu --import "$OUT/packed_bwd.ncu-rep" --page details --csv >"$OUT/packed_bwd_details.csv" 2>&1
      ncu --import "$OUT/packed_bwd.ncu-rep" --page source --csv --print-source sass 2>&1 | gzip >"$OUT/packed_bwd_source.csv.gz"
      rm -f "$OUT/packed_bwd.ncu-rep"
      ;;
    ncu-options)  # per-SASS-line counts of the plain forward and the variant options' (NCU_OPTIONS)
      timeout ${NCU_TIMEOUT:-300} ncu --clock-control none --kernel-name regex:fwd_ws_kernel --section SpeedOfLight \
        --section LaunchStats --section WarpStateStats --section SchedulerStats --section SourceCounters \
        -f -o "$OUT/options" python3 -P benchmarks/prof_options.py --options ${NCU_OPTIONS:-plain window lengths alibi} \
        >"$OUT/ncu_options.log" 2>&1
      echo "ncu-options rc=$?" | tee -a "$OUT/summary.txt"
      ncu --import "$OUT/options.ncu-rep" --page details --csv >"$OUT/options_details.csv" 2>&1
      ncu --import "$OUT/options.ncu-rep" --page source --csv --print-source sass 2>&1 | gzip >"$OUT/options_source.csv.gz"
      rm -f "$OUT/options.ncu-rep"
      ;;
    ncu-grid)  # jax_flash's and cuDNN's fwd+bwd kernels at one grid point (NCU_GRID: prof_grid.py's arguments)
      XLA_FLAGS=--xla_gpu_autotune_level=0 timeout ${NCU_TIMEOUT:-300} ncu --clock-control none --section SpeedOfLight \
        --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section WarpStateStats \
        -f -o "$OUT/grid" python3 -P benchmarks/prof_grid.py ${NCU_GRID:-} >"$OUT/ncu_grid.log" 2>&1
      echo "ncu-grid rc=$?" | tee -a "$OUT/summary.txt"
      ncu --import "$OUT/grid.ncu-rep" --page details --csv >"$OUT/grid_details.csv" 2>&1
      rm -f "$OUT/grid.ncu-rep"
      ;;
    test-decode)  # the KV-cache / split-KV decode tests (GPU and CPU)
      XLA_FLAGS=--xla_gpu_autotune_level=0 timeout ${TEST_TIMEOUT:-240} python3 -P -m pytest -q -rfE \
        tests/test_cuda_kvcache.py tests/test_kvcache.py 2>&1 | tee "$OUT/pytest_kvcache.log" | tail -15
      ;;
    sanitize-decode)  # memcheck over the paged, bad-page and append decode tests
      timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 python3 -P -m pytest -q -x \
        tests/test_cuda_kvcache.py -k "out_of_range or paged_equals or append" >"$OUT/memcheck_decode.log" 2>&1
      echo "memcheck decode rc=$?" | tee -a "$OUT/summary.txt"
      ;;
    bench-decode)  # results/<gpu>_decode.json, beside this GPU's read ceiling (hbm_read.json)
      ceiling=""
      if nvcc -O3 -arch=native benchmarks/hbm_read.cu -o /tmp/hbm_read && timeout 120 /tmp/hbm_read "$OUT/hbm_read.json" \
          | tee "$OUT/hbm_read.log"; then
        ceiling="--read-ceiling $OUT/hbm_read.json"
      fi
      timeout ${BENCH_TIMEOUT:-300} python3 -P benchmarks/bench_decode.py --dtypes "${BENCH_DTYPES:-bfloat16}" --runs 2 \
        $ceiling ${SPLIT_SWEEP:+--split-sweep $SPLIT_SWEEP} --out "$OUT/${gpu_tag}_decode.json" 2>&1 | tee "$OUT/bench_decode.log"
      ;;
    bench-generate)  # results/<gpu>_generate.json
      timeout ${BENCH_TIMEOUT:-200} python3 -P benchmarks/bench_generate.py --out "$OUT/${gpu_tag}_generate.json" 2>&1 \
        | tee "$OUT/bench_generate.log"
      ;;
    ncu-decode)  # one profiled split-kernel launch per bench_decode shape index (NCU_SHAPES)
      for i in ${NCU_SHAPES:-0 8}; do
        timeout 90 ncu --kernel-name regex:decode_kernel --launch-skip 2 --launch-count 1 --section SpeedOfLight \
          --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy --section LaunchStats \
          python3 -P benchmarks/bench_decode.py --shapes $i --impls jax_flash --time 0.01 >"$OUT/ncu_decode$i.txt" 2>&1
        echo "ncu decode shape $i rc=$?" | tee -a "$OUT/summary.txt"
      done
      ;;
    pack)  # at most 8 files come back from the device: everything else in one archive (last stage)
      tar czf /tmp/jf_session.tgz -C "$OUT" --exclude=summary.txt . && mv /tmp/jf_session.tgz "$OUT/session.tgz" &&
        find "$OUT" -mindepth 1 ! -name session.tgz ! -name summary.txt -delete
      ;;
    order)  # causal launch order A/B (cpp/cuda/common/tile_order.h), heads vs auto interleaved; the test
            # stage's suite holds tests/test_cuda_launch_order.py (same results under every order)
      for i in $(seq ${ORDER_ROUNDS:-2}); do
        for o in heads auto; do
          JAX_FLASH_FWD_ORDER=$o JAX_FLASH_BWD_ORDER=$o timeout ${BENCH_TIMEOUT:-300} python3 -P \
            benchmarks/bench_attention.py --causal yes --head-dims ${ORDER_HEAD_DIMS:-64 128 256} \
            --impls jax_flash cudnn --out "$OUT/order_${o}_$i.json" >"$OUT/order_${o}_$i.log" 2>&1
          echo "order $o round $i rc=$?" | tee -a "$OUT/summary.txt"
        done
      done
      for o in heads auto; do
        JAX_FLASH_FWD_ORDER=$o JAX_FLASH_BWD_ORDER=$o timeout ${BENCH_TIMEOUT:-300} python3 -P \
          benchmarks/bench_variants.py --benches packed option --out "$OUT/variants_order_$o.json" \
          >"$OUT/variants_order_$o.log" 2>&1
      done
      ;;
  esac
done
cat "$OUT/summary.txt" 2>/dev/null
