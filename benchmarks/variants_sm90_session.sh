#!/usr/bin/env bash
# One device call for the Hopper masks-only forward: the standalone harness
# (tests/cuda, --masks: kernel vs the float64 reference at d64/128/256, and
# MBENCH timings) built and run beside the package build; then the variants
# benchmark through JAX and the GPU variants tests. Logs and JSON under $OUT.
#   bash benchmarks/variants_sm90_session.sh
# Env: HDIMS (JAX_FLASH_CUDA_HEAD_DIMS, default "64;128;256"), DEADLINE
# (seconds for the whole script, default 470), TESTS (default
# tests/test_cuda_variants.py). Needs the nvidia-cutlass wheel on PYTHONPATH.
set -uo pipefail
OUT=${OUT:-/tmp/jf_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
t0=$(date +%s)
DEADLINE=${DEADLINE:-470}
left() { echo $(( DEADLINE - ($(date +%s) - t0) )); }
log() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader >>"$OUT/summary.txt" 2>&1

# Harness (sm_90a units only, no SM80 column), built and run in the background.
(
  cd tests/cuda
  s=$(date +%s)
  make -f Makefile.sm90 -j8 SM80=0 ALTS= >/tmp/harness_build.log 2>&1
  rc=$?
  echo "harness build rc=$rc in $(( $(date +%s) - s )) s" >>"$OUT/harness.log"
  [ $rc -eq 0 ] || { tail -40 /tmp/harness_build.log >>"$OUT/harness.log"; exit 1; }
  grep -h -A2 "sm90_kernel" build/fwd_sm90_*.ptxas.log | grep -E "registers|spill" >>"$OUT/harness.log"
  OMP_NUM_THREADS=8 timeout 200 ./build/fwd_sm90_harness --masks >>"$OUT/harness.log" 2>&1
  echo "harness rc=$?" >>"$OUT/harness.log"
) &
hpid=$!

# Package build (sm_90a only).
s=$(date +%s)
JAX_FLASH_CUDA=1 JAX_FLASH_CUDA_ARCHS=90a JAX_FLASH_CUDA_HEAD_DIMS="${HDIMS:-64;128;256}" \
  CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -v . >/tmp/build.log 2>&1
rc=$?
log "package build rc=$rc in $(( $(date +%s) - s )) s (HDIMS=${HDIMS:-64;128;256}, 90a, 16 cores, harness build beside it)"
tail -30 /tmp/build.log >"$OUT/build_tail.log"
for f in build/*/.ninja_log; do
  [ -f "$f" ] && awk 'NR > 1 { printf "%7.1f s  %s\n", ($2 - $1) / 1000, $4 }' "$f" | sort -rn >"$OUT/compile_times.txt"
done
[ $rc -eq 0 ] || { wait $hpid; exit 1; }
(cd /tmp && timeout 60 python3 -m jax_flash --no-timing) 2>&1 | tail -4 | tee -a "$OUT/summary.txt"

# Variants benchmark, forward first (the records are written as they come).
wait $hpid
log "harness: $(grep -E 'cases failed|harness rc' "$OUT/harness.log" | tr '\n' ' ')"
timeout $(( $(left) - 170 )) python3 -P benchmarks/bench_variants.py --modes fwd \
  --out "$OUT/variants_fwd.json" >"$OUT/variants.log" 2>&1
log "bench fwd rc=$?"

XLA_PYTHON_CLIENT_PREALLOCATE=false XLA_FLAGS=--xla_gpu_autotune_level=0 \
  timeout $(( $(left) - 60 )) python3 -P -m pytest -m gpu -n 6 -x -q -rfE --durations=5 \
  ${TESTS:-tests/test_cuda_variants.py} >"$OUT/pytest.log" 2>&1
log "pytest rc=$?: $(tail -1 "$OUT/pytest.log")"

# Forward+backward, as long as time is left (the backward is unchanged).
[ "$(left)" -gt 30 ] && timeout $(( $(left) - 10 )) python3 -P benchmarks/bench_variants.py \
  --modes fwd_bwd --benches window option --out "$OUT/variants_fwd_bwd.json" >>"$OUT/variants.log" 2>&1
log "bench fwd_bwd rc=$?"
