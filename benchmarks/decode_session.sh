#!/usr/bin/env bash
# One device call for the split-KV decode kernels: build (training kernels of
# one head dim only, decode kernels for 64/128/256), GPU tests, memcheck of the
# paged / bad-page tests, and bench_decode. Logs and JSON under $OUT.
#   DTYPES="bf16;fp16" bash benchmarks/decode_session.sh [build] [test] [bench] [generate] [ncu] [sanitize]
set -uo pipefail
OUT=${OUT:-/tmp/jf_out}
mkdir -p "$OUT"
stages=${*:-build test bench sanitize}
DTYPES=${DTYPES:-bf16}
export PYTHONUNBUFFERED=1
if [ -d ../../.whl ] && ! python3 -c "import cutlass_library" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site ../../.whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
for stage in $stages; do
  case $stage in
    build)
      start=$(date +%s)
      JAX_FLASH_CUDA=1 JAX_FLASH_CUDA_ARCHS=90a JAX_FLASH_CUDA_HEAD_DIMS=128 \
        JAX_FLASH_CUDA_VARIANT_HEAD_DIMS=128 JAX_FLASH_CUDA_DECODE_HEAD_DIMS="64;128;256" \
        JAX_FLASH_CUDA_DTYPES="$DTYPES" CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
        python3 -m pip install --no-build-isolation --no-deps -v . >"$OUT/build.log" 2>&1
      rc=$?
      echo "build rc=$rc in $(( $(date +%s) - start )) s" | tee -a "$OUT/summary.txt"
      [ $rc -eq 0 ] || { tail -60 "$OUT/build.log"; exit 1; }
      ;;
    test)
      XLA_FLAGS=--xla_gpu_autotune_level=0 timeout ${TEST_TIMEOUT:-240} python3 -P -m pytest -q -rfE \
        tests/test_cuda_kvcache.py tests/test_kvcache.py -x 2>&1 | tee "$OUT/pytest_kvcache.log" | tail -15
      ;;
    sanitize)
      timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 python3 -P -m pytest -q -x \
        tests/test_cuda_kvcache.py -k "out_of_range or paged_equals or append" >"$OUT/memcheck.log" 2>&1
      echo "memcheck rc=$?" | tee -a "$OUT/summary.txt"
      tail -4 "$OUT/memcheck.log"
      ;;
    bench)
      timeout ${BENCH_TIMEOUT:-200} python3 -P benchmarks/bench_decode.py \
        --dtypes "${BENCH_DTYPES:-bfloat16}" --time ${BENCH_TIME:-0.2} \
        ${SPLIT_SWEEP:+--split-sweep $SPLIT_SWEEP} --out "$OUT/h100_decode.json" 2>&1 \
        | tee "$OUT/bench_decode.log"
      ;;
    generate)
      timeout ${GEN_TIMEOUT:-120} python3 -P benchmarks/bench_generate.py --out "$OUT/h100_generate.json" 2>&1 \
        | tee "$OUT/bench_generate.log"
      ;;
    ncu)  # one profiled launch of the split kernel per shape (SHAPES indices)
      for i in ${NCU_SHAPES:-0 8}; do
        timeout 90 ncu --kernel-name regex:decode_kernel --launch-skip 2 --launch-count 1 \
          --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
          --section Occupancy --section LaunchStats python3 -P benchmarks/bench_decode.py --shapes $i \
          --impls jax_flash --time 0.01 >"$OUT/ncu_shape$i.txt" 2>&1
        echo "ncu shape $i rc=$?" | tee -a "$OUT/summary.txt"
        grep -E "DRAM Throughput|Memory Throughput|Duration|Achieved Occupancy|Registers Per|Waves Per SM" \
          "$OUT/ncu_shape$i.txt" | head -8
      done
      ;;
  esac
done
