#!/usr/bin/env bash
# One device call for the CUDA variants: build both harnesses for a few head
# dims, run the variant cases (fwd o/lse, bwd dq/dk/dv in both modes), plain
# regressions and timings, and the sanitizers on a variant case. Logs under
# $OUT (at most 8 files): summary.txt build.log ptxas.txt fwd_var.log
# bwd_var.log plain.log san.log.
#   HDIMS="64 128" ARCHS=90a bash tests/cuda/variants_session.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/jf_out}
mkdir -p "$OUT"
export HDIMS=${HDIMS:-"64 128"} ARCHS=${ARCHS:-90a} NO_TUNE=1
S=$(date +%s)
make -C tests/cuda -j"$(nproc)" NO_TUNE=1 BUILD=build >"$OUT/build.log" 2>&1 &
fpid=$!
JOBS=$(nproc) BUILD=build/bwd tests/cuda/build_bwd_harness.sh >>"$OUT/build.log" 2>&1
rb=$?
wait $fpid
rf=$?
echo "build (HDIMS=$HDIMS ARCHS=$ARCHS, $(nproc) cores): fwd rc=$rf bwd rc=$rb in $(( $(date +%s) - S )) s" | tee "$OUT/summary.txt"
for f in tests/cuda/build/*.ptxas.log build/bwd/*.ptxas.log; do
  echo "== $f"; grep -E "Compiling entry|spill|registers" "$f" | sed 's/ptxas info    : //'
done >"$OUT/ptxas.txt" 2>&1
[ $rf -eq 0 ] && [ $rb -eq 0 ] || { tail -40 "$OUT/build.log"; exit 1; }
F=tests/cuda/build/fwd_harness
B=build/bwd/bwd_harness

timeout 240 $F --variants >"$OUT/fwd_var.log" 2>&1; echo "fwd variants rc=$?" | tee -a "$OUT/summary.txt"
timeout 300 $B variants >"$OUT/bwd_var.log" 2>&1; echo "bwd variants rc=$?" | tee -a "$OUT/summary.txt"
{
  timeout 60 $F --small; echo "fwd plain small rc=$?"
  for a in "2 37 53 4 2 64 1" "1 300 257 4 1 128 1 fp16" "2 129 200 2 2 128 0" "3 257 301 8 2 64 0 fp16"; do
    timeout 60 $B one $a; echo "bwd plain one $a rc=$?"
  done
  timeout 120 $F --bench
  timeout 120 $B bench 128 16384
} >"$OUT/plain.log" 2>&1
grep -E "rc=|failed" "$OUT/plain.log" | tee -a "$OUT/summary.txt"

if [ $(( $(date +%s) - S )) -gt ${SAN_AFTER_S:-420} ]; then
  echo "sanitizers skipped (time)" | tee -a "$OUT/summary.txt"
else {
  (cd tests/cuda && BUILD=build LOG_DIR=/tmp/san_fwd timeout 300 bash sanitize.sh); echo "sanitize.sh rc=$?"
  SKIP_BUILD=1 BUILD=build/bwd LOGDIR=/tmp/san_bwd SMALL_ARGS="one 2 37 53 4 2 64 1" timeout 400 \
    bash tests/cuda/sanitize_bwd.sh; echo "sanitize_bwd.sh rc=$?"
} >"$OUT/san.log" 2>&1
grep -E "compute-sanitizer|rc=" "$OUT/san.log" | tee -a "$OUT/summary.txt"
fi
grep -hE "^(FAIL|PASS VAR|ok   VAR)|variant cases|VBENCH" "$OUT/fwd_var.log" "$OUT/bwd_var.log" | grep -E "FAIL|cases|VBENCH" | tee -a "$OUT/summary.txt"
echo "total $(( $(date +%s) - S )) s" | tee -a "$OUT/summary.txt"
