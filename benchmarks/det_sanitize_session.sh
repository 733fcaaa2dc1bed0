#!/usr/bin/env bash
# One device call: compute-sanitizer memcheck and racecheck on the
# deterministic backward paths added in the seventh session, which had not run
# under the sanitizers yet:
#   - the Hopper plain kernel's lowest-key-tile-first order (causal, >= 64 key
#     tiles, <= 64 (kv head, batch) pairs): `bwd_harness one` at 1 x 8200, d64
#     and 2000 x 8200 at d128 (atomic, deterministic, deterministic again,
#     against float64), memcheck;
#   - the d256 split (wide kernel dK/dV + SM80 dQ kernel): `bwd_sm90_wide_harness
#     one` on a small causal GQA case with odd seqlens;
#   - the existing small cases (`bwd_harness small`, `variants small`) for the
#     highest-first order and the masks-only deterministic kernel.
# Both harnesses build side by side (sm_90a). Logs and summary.txt under $OUT.
# LONG_ONLY=1: only the two long low-first cases (and only bwd_harness).
# Needs the nvidia-cutlass wheel on PYTHONPATH.
set -uo pipefail
OUT=${OUT:-/tmp/jf_out}
mkdir -p "$OUT"
t0=$(date +%s)
log() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a "$OUT/summary.txt"; }

LONG_ONLY=${LONG_ONLY:-0}
jobs=8; [ "$LONG_ONLY" = 1 ] && jobs=16
ARCHS=90a HDIMS="64 128" JOBS=$jobs BUILD=build/bwd90 bash tests/cuda/build_bwd_harness.sh >"$OUT/build_bwd.log" 2>&1 &
p1=$!
r2=skipped
if [ "$LONG_ONLY" != 1 ]; then
  JOBS=8 bash tests/cuda/build_bwd_sm90_wide_harness.sh >"$OUT/build_wide.log" 2>&1 &
  p2=$!
fi
wait $p1; r1=$?
[ -n "${p2:-}" ] && { wait $p2; r2=$?; }
log "builds: bwd_harness rc=$r1, wide harness rc=$r2"

# sanitize NAME TOOL BINARY ARGS...: one sanitizer run, its verdict in summary.txt.
# --launch-timeout 0: the long cases build their float64 reference on the host
# before the first CUDA call, longer than the sanitizer's default wait to attach.
sanitize() {
  local name=$1 tool=$2; shift 2
  local f="$OUT/sanitize_${name}_$tool.log"
  timeout ${SAN_TIMEOUT:-240} compute-sanitizer --tool "$tool" --launch-timeout 0 --error-exitcode 99 "$@" >"$f" 2>&1
  local r=$?
  log "$name $tool rc=$r $(grep -h 'ERROR SUMMARY\|RACECHECK SUMMARY\|failures\|FAIL' "$f" | head -3 | tr '\n' ' ')"
}
if [ $r1 -eq 0 ]; then
  # The low-first order changes which CTA does what, not shared memory: memcheck
  # alone on the long cases (racecheck at 8k would take minutes). Their float64
  # references run one thread a head (~1-2 min), so they go in the background.
  # d128: 2000 queries against 65 key tiles, the ones past the queries empty.
  # Side by side: each reference is one thread.
  SAN_TIMEOUT=400 sanitize low_first_d64 memcheck ./build/bwd90/bwd_harness one 1 8200 8200 1 1 64 1 &
  lf=$!
  SAN_TIMEOUT=400 sanitize low_first_d128 memcheck ./build/bwd90/bwd_harness one 1 2000 8200 1 1 128 1 &
  lf2=$!
  [ "$LONG_ONLY" = 1 ] || for tool in memcheck racecheck; do
    sanitize small $tool ./build/bwd90/bwd_harness small
    sanitize variants_small $tool ./build/bwd90/bwd_harness variants small
  done
fi
if [ "$r2" = 0 ]; then
  for tool in memcheck racecheck; do
    sanitize wide_det_split $tool ./build/bwd90w/bwd_sm90_wide_harness one 2 300 517 4 2 1
  done
fi
[ -n "${lf:-}" ] && wait $lf $lf2
log "done"
