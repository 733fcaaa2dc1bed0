#!/usr/bin/env bash
# One device call for the d256 deterministic split (branch wide-det-split):
# the wide harness (test: 60 d256 cases in both modes; bench: atomic, the SM80
# pair and the split, fwd+bwd) built beside a 256-only package build, then the
# GPU deterministic backward test at d256. Logs under $OUT. Needs the
# nvidia-cutlass wheel on PYTHONPATH.
set -uo pipefail
OUT=${OUT:-/tmp/jf_out}
mkdir -p "$OUT"
t0=$(date +%s)
log() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a "$OUT/summary.txt"; }
( JOBS=10 bash tests/cuda/build_bwd_sm90_wide_harness.sh >"$OUT/harness_build.log" 2>&1 &&
  ./build/bwd90w/bwd_sm90_wide_harness test >"$OUT/wide_test.log" 2>&1 &&
  timeout 200 ./build/bwd90w/bwd_sm90_wide_harness bench >"$OUT/wide_bench.log" 2>&1
  echo "harness rc=$?" >>"$OUT/wide_test.log" ) &
hpid=$!
JAX_FLASH_CUDA=1 JAX_FLASH_CUDA_ARCHS=90a JAX_FLASH_CUDA_HEAD_DIMS=256 CMAKE_BUILD_PARALLEL_LEVEL=6 \
  python3 -m pip install -q --no-build-isolation --no-deps . >"$OUT/build.log" 2>&1
log "package build rc=$?"
wait $hpid
log "harness: $(grep -h 'd256:\|harness rc' "$OUT/wide_test.log" | tr '\n' ' ')"
cat "$OUT/wide_bench.log" >>"$OUT/summary.txt"
XLA_PYTHON_CLIENT_PREALLOCATE=false XLA_FLAGS=--xla_gpu_autotune_level=0 timeout 120 \
  python3 -P -m pytest -m gpu -q -rfE tests/test_cuda_backward.py -k "d256" >"$OUT/pytest.log" 2>&1
log "pytest rc=$?: $(tail -1 "$OUT/pytest.log")"
