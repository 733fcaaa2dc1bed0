#!/usr/bin/env bash
# Build tests/cuda/bwd_sm90_sanitize.cu with the Hopper backward units (bf16,
# head dims 64/128, sm_90a) and run compute-sanitizer memcheck, racecheck
# and synccheck on it. Exits non-zero on any report or failed case.
#   LOG_DIR=... bash tests/cuda/sanitize_bwd_sm90.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-/tmp/jf_sanitize_bwd_sm90}
LOG=${LOG_DIR:-$BUILD}
mkdir -p "$BUILD" "$LOG"
CUTE_INC=${CUTE_INC:-}
[ -n "$CUTE_INC" ] || CUTE_INC=$(python3 -c "import cutlass_library,os;print(os.path.join(os.path.dirname(cutlass_library.__file__),'source','include'))")
FLAGS=(-std=c++17 -O3 --expt-relaxed-constexpr --use_fast_math -gencode=arch=compute_90a,code=sm_90a -I cpp -I "$CUTE_INC")
pids=()
for u in bwd_sm90_hdim64_bf16 bwd_sm90_hdim128_bf16; do
  nvcc "${FLAGS[@]}" -c "cpp/cuda/instantiations/$u.cu" -o "$BUILD/$u.o" & pids+=($!)
done
nvcc "${FLAGS[@]}" -c tests/cuda/bwd_sm90_sanitize.cu -o "$BUILD/driver.o" & pids+=($!)
for p in "${pids[@]}"; do wait "$p"; done
nvcc "${FLAGS[@]}" "$BUILD"/*.o -o "$BUILD/bwd_sm90_sanitize"
status=0
for tool in memcheck racecheck synccheck; do
  log="$LOG/sanitize_bwd_sm90_$tool.log"
  if ! compute-sanitizer --tool "$tool" --error-exitcode 99 "$BUILD/bwd_sm90_sanitize" >"$log" 2>&1; then
    echo "compute-sanitizer $tool: FAILED (see $log)"
    status=1
  elif ! grep -qE "(ERROR SUMMARY: 0 errors|RACECHECK SUMMARY: 0 hazards)" "$log"; then
    echo "compute-sanitizer $tool: no clean summary (see $log)"
    status=1
  else
    echo "compute-sanitizer $tool: clean"
  fi
  tail -n 2 "$log"
done
exit $status
