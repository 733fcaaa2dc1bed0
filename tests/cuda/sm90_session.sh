#!/bin/bash
# Device session of the Hopper forward harness: (re)build what is stale,
# dump SASS facts, run the cases + bench. Logs under ${OUT:-.}.
#   bash sm90_session.sh [harness args]   (--masks: the masks-only variants kernel; --logits: soft-cap / ALiBi)
cd "$(dirname "$0")"
OUT=${OUT:-.}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv > "$OUT/gpu.txt" 2>&1
if ldd build/fwd_sm90_harness 2>&1 | grep -q "not found" || [ ! -x build/fwd_sm90_harness ]; then SM90_REBUILD=1; fi
# SM90_MAKE_ARGS: e.g. "SM80=0" (Makefile.sm90 says what it does).
if [ -n "$SM90_REBUILD" ]; then make -f Makefile.sm90 -j16 $SM90_MAKE_ARGS > "$OUT/build.log" 2>&1 || { cat "$OUT/build.log"; exit 1; }; fi
for o in build/fwd_sm90_hdim128_bf16.o build/fwd_sm90_hdim64_bf16.o build/fwd_sm90_hdim256_bf16.o build/d128_n192_noov.o \
         build/fwd_sm90_masks_hdim64_bf16.o build/fwd_sm90_masks_hdim128_bf16.o build/fwd_sm90_masks_hdim256_bf16.o \
         build/fwd_sm90_logits_hdim64_bf16.o build/fwd_sm90_logits_hdim128_bf16.o build/fwd_sm90_logits_hdim256_bf16.o; do
  if command -v cuobjdump > /dev/null; then
    echo "$o: HGMMA $(cuobjdump -sass $o | grep -c HGMMA) LDL/STL $(cuobjdump -sass $o | grep -cE 'LDL|STL')" >> "$OUT/sass.txt"
  fi
done
grep -h -A2 "sm90_kernel" build/fwd_sm90_*.ptxas.log | grep -E "registers|spill" > "$OUT/ptxas.txt"
OMP_NUM_THREADS=16 ./build/fwd_sm90_harness "$@" 2>&1 | tee "$OUT/harness.log" | grep -v "^PASS"
# Integration: the regular harness built with JAX_FLASH_FWD_SM90 (build_int,
# Makefile ARCHS=90a HDIMS="64 128"): run_fwd dispatches plain calls to sm90.
if [ -x build_int/fwd_harness ] && [ -z "$SM90_SKIP_INT" ]; then
  OMP_NUM_THREADS=16 ./build_int/fwd_harness --small 2>&1 | tee "$OUT/int_small.log" | tail -4
  OMP_NUM_THREADS=16 ./build_int/fwd_harness --bench 2>&1 | tee "$OUT/int_bench.log" | grep BENCH
fi
