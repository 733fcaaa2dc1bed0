#!/usr/bin/env bash
# Build the forward harness and run compute-sanitizer memcheck and racecheck
# on small causal GQA cases with odd seqlens (vector and element-wise paths),
# then on two variant cases (segments+causal+lengths+softcap+ALiBi+dropout GQA,
# window+offset): `fwd_harness --variants --small`.
# Exits non-zero on any sanitizer report or test failure.
set -euo pipefail
cd "$(dirname "$0")"
BUILD=${BUILD:-build}
LOG=${LOG_DIR:-$BUILD}
mkdir -p "$LOG"
make -j"$(nproc)" BUILD="$BUILD" ${CUTE_INC:+CUTE_INC="$CUTE_INC"} ${HDIMS:+HDIMS="$HDIMS"} ${NO_TUNE:+NO_TUNE=1} >/dev/null
status=0
for args in "--small" "--variants --small"; do
  tag=$( [ "$args" = "--small" ] && echo plain || echo variants )
  for tool in memcheck racecheck; do
    log="$LOG/sanitize_${tag}_$tool.log"
    if ! compute-sanitizer --tool "$tool" --error-exitcode 99 "$BUILD/fwd_harness" $args >"$log" 2>&1; then
      echo "compute-sanitizer $tool ($tag): FAILED (see $log)"
      status=1
    elif ! grep -qE "(ERROR SUMMARY: 0 errors|RACECHECK SUMMARY: 0 hazards)" "$log"; then
      echo "compute-sanitizer $tool ($tag): no clean summary (see $log)"
      status=1
    else
      echo "compute-sanitizer $tool ($tag): clean"
    fi
    tail -n 3 "$log"
  done
done
exit $status
