#!/usr/bin/env bash
# Build the backward harness and run compute-sanitizer memcheck and racecheck
# on a small causal GQA case with odd seqlens (both atomic and deterministic
# modes run inside `bwd_harness small`). Exits non-zero on any report.
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
for tool in memcheck racecheck; do
  compute-sanitizer --tool "$tool" --error-exitcode 99 "$BUILD/bwd_harness" small \
    > "$LOGDIR/sanitize_$tool.log" 2>&1
  r=$?
  if [ $r -ne 0 ] || grep -q "ERROR SUMMARY: [1-9]\|RACECHECK SUMMARY: [1-9]" "$LOGDIR/sanitize_$tool.log"; then
    echo "compute-sanitizer $tool: FAILED (rc=$r)"; tail -30 "$LOGDIR/sanitize_$tool.log"; rc=1
  else
    echo "compute-sanitizer $tool: clean"; tail -2 "$LOGDIR/sanitize_$tool.log"
  fi
done
exit $rc
