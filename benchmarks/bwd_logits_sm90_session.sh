#!/usr/bin/env bash
# One device call for the Hopper soft-cap / ALiBi backward (bwd_sm90_logits_*):
# the standalone backward harness (tests/cuda/build_bwd_harness.sh, sm_90a,
# head dims 64 and 128) built beside the package build; `bwd_harness variants`
# (every variant case through run_bwd against the float64 reference, then the
# VBENCH backward timings: production kernels, the SM80 generic kernel they
# replace, and the alternatives in tests/cuda/bwd_alt.cu); then fwd+bwd
# through JAX for plain causal / soft-cap / ALiBi / both at 8k d128, and the
# GPU variants and backward tests. Logs under $OUT.
#   bash benchmarks/bwd_logits_sm90_session.sh
# Env: DEADLINE (seconds for the whole script, default 570), TESTS (default
# tests/test_cuda_variants.py tests/test_cuda_backward.py), SANITIZE, OPTIONS
# (bench_variants --options, default "softcap alibi"). Needs the
# nvidia-cutlass wheel on PYTHONPATH.
set -uo pipefail
OUT=${OUT:-/tmp/jf_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
t0=$(date +%s)
DEADLINE=${DEADLINE:-570}
left() { echo $(( DEADLINE - ($(date +%s) - t0) )); }
log() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader >>"$OUT/summary.txt" 2>&1
git log --oneline -1 >>"$OUT/summary.txt" 2>&1

# Harness (sm_90a, d64 + d128 units), built and run in the background.
(
  s=$(date +%s)
  ARCHS=90a HDIMS="64 128" JOBS=8 BUILD=build/bwd90 bash tests/cuda/build_bwd_harness.sh >/tmp/harness_build.log 2>&1
  rc=$?
  echo "harness build rc=$rc in $(( $(date +%s) - s )) s" >>"$OUT/harness.log"
  [ $rc -eq 0 ] || { tail -40 /tmp/harness_build.log >>"$OUT/harness.log"; exit 1; }
  for f in build/bwd90/bwd_sm90_logits_*.ptxas.log build/bwd90/bwd_alt.ptxas.log; do
    echo "== $f" >>"$OUT/harness.log"
    grep -E "C75|Compiling entry.*dkdv|registers|spill" "$f" | grep -B0 -A2 "dkdv\|C75" | grep -v "^--" \
      | sed 's/ptxas info    : //; s/.*BwdSm90TraitsILi/  /' >>"$OUT/harness.log"
  done
  OMP_NUM_THREADS=8 timeout 330 ./build/bwd90/bwd_harness variants >>"$OUT/harness.log" 2>&1
  echo "harness rc=$?" >>"$OUT/harness.log"
  # SANITIZE=1: memcheck and racecheck on the small variant cases (one of
  # them soft-cap + ALiBi on the Hopper kernel), reusing this build.
  if [ -n "${SANITIZE:-}" ]; then
    for tool in memcheck racecheck; do
      timeout 120 compute-sanitizer --tool $tool --error-exitcode 99 ./build/bwd90/bwd_harness variants small \
        >"$OUT/sanitize_variants_$tool.log" 2>&1
      echo "sanitize $tool rc=$? $(grep -h 'ERROR SUMMARY\|RACECHECK SUMMARY' "$OUT/sanitize_variants_$tool.log" | tr '\n' ' ')" >>"$OUT/harness.log"
    done
  fi
) &
hpid=$!

# Package build (sm_90a only, head dims 64 and 128).
s=$(date +%s)
JAX_FLASH_CUDA=1 JAX_FLASH_CUDA_ARCHS=90a JAX_FLASH_CUDA_HEAD_DIMS="64;128" \
  CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -v . >/tmp/build.log 2>&1
rc=$?
log "package build rc=$rc in $(( $(date +%s) - s )) s (64;128, 90a, harness build beside it)"
tail -30 /tmp/build.log >"$OUT/build_tail.log"
[ $rc -eq 0 ] || { wait $hpid; exit 1; }

# Timings only once the harness is done with the GPU.
wait $hpid
log "harness: $(grep -E 'variant cases|harness rc|harness build|sanitize' "$OUT/harness.log" | tr '\n' ' ')"
grep -c "^FAIL" "$OUT/harness.log" | sed 's/^/harness FAIL lines: /' | tee -a "$OUT/summary.txt"
grep -E "^VBENCH" "$OUT/harness.log" | grep -E "plain causal|softcap|alibi|dropout" | tee -a "$OUT/summary.txt"

timeout $(( $(left) - 150 )) python3 -P benchmarks/bench_variants.py --modes fwd fwd_bwd --benches option \
  --options ${OPTIONS:-softcap alibi} --out "$OUT/variants_logits.json" >"$OUT/variants.log" 2>&1
log "bench rc=$?"
tee -a "$OUT/summary.txt" <"$OUT/variants.log" >/dev/null

XLA_PYTHON_CLIENT_PREALLOCATE=false XLA_FLAGS=--xla_gpu_autotune_level=0 \
  timeout $(( $(left) - 10 )) python3 -P -m pytest -m gpu -n 6 -q -rfE --durations=5 \
  ${TESTS:-tests/test_cuda_variants.py tests/test_cuda_backward.py} >"$OUT/pytest.log" 2>&1
log "pytest rc=$?: $(tail -1 "$OUT/pytest.log")"
