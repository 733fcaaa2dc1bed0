#!/usr/bin/env bash
# Build the forward harness and run compute-sanitizer memcheck and racecheck
# on small causal GQA cases with odd seqlens (vector and element-wise paths).
# Exits non-zero on any sanitizer report or test failure.
set -euo pipefail
cd "$(dirname "$0")"
BUILD=${BUILD:-build}
LOG=${LOG_DIR:-$BUILD}
mkdir -p "$LOG"
make -j"$(nproc)" BUILD="$BUILD" ${CUTE_INC:+CUTE_INC="$CUTE_INC"} >/dev/null
status=0
for tool in memcheck racecheck; do
  if ! compute-sanitizer --tool "$tool" --error-exitcode 99 "$BUILD/fwd_harness" --small >"$LOG/sanitize_$tool.log" 2>&1; then
    echo "compute-sanitizer $tool: FAILED (see $LOG/sanitize_$tool.log)"
    status=1
  elif ! grep -qE "(ERROR SUMMARY: 0 errors|RACECHECK SUMMARY: 0 hazards)" "$LOG/sanitize_$tool.log"; then
    echo "compute-sanitizer $tool: no clean summary (see $LOG/sanitize_$tool.log)"
    status=1
  else
    echo "compute-sanitizer $tool: clean"
  fi
  tail -n 3 "$LOG/sanitize_$tool.log"
done
exit $status
