#!/usr/bin/env bash
# Build the backward harness and run compute-sanitizer memcheck and racecheck
# on a small causal GQA case with odd seqlens (both atomic and deterministic
# modes run inside `bwd_harness small`), then on two variant cases
# (`bwd_harness variants small`). Exits non-zero on any report.
# Logs go to ${LOGDIR:-build/bwd}.
set -uo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build/bwd}
LOGDIR=${LOGDIR:-$BUILD}
if [ -z "${SKIP_BUILD:-}" ]; then
  ARCHS=${ARCHS:-"90a"} BUILD=$BUILD tests/cuda/build_bwd_harness.sh || exit 1
fi
mkdir -p "$LOGDIR"
rc=0
# SMALL_ARGS overrides the plain case (e.g. "one 2 37 53 4 2 64 1" when
# head dim 96 is not built).
for args in "${SMALL_ARGS:-small}" "variants small"; do
  tag=$( [ "$args" = "variants small" ] && echo variants || echo plain )
  for tool in memcheck racecheck; do
    log="$LOGDIR/sanitize_${tag}_$tool.log"
    compute-sanitizer --tool "$tool" --error-exitcode 99 "$BUILD/bwd_harness" $args > "$log" 2>&1
    r=$?
    if [ $r -ne 0 ] || grep -q "ERROR SUMMARY: [1-9]\|RACECHECK SUMMARY: [1-9]" "$log"; then
      echo "compute-sanitizer $tool ($tag): FAILED (rc=$r)"; tail -30 "$log"; rc=1
    else
      echo "compute-sanitizer $tool ($tag): clean"; tail -2 "$log"
    fi
  done
done
exit $rc
