#!/bin/bash
# Device session of the Hopper forward harness: (re)build what is stale,
# dump SASS facts, run the cases + bench. Logs under ${OUT:-.}.
#   bash sm90_session.sh [harness args]
cd "$(dirname "$0")"
OUT=${OUT:-.}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv > "$OUT/gpu.txt" 2>&1
if ldd build/fwd_sm90_harness 2>&1 | grep -q "not found" || [ ! -x build/fwd_sm90_harness ]; then SM90_REBUILD=1; fi
if [ -n "$SM90_REBUILD" ]; then make -f Makefile.sm90 -j16 > "$OUT/build.log" 2>&1 || { cat "$OUT/build.log"; exit 1; }; fi
for o in build/fwd_sm90_hdim128_bf16.o build/fwd_sm90_hdim64_bf16.o build/fwd_sm90_alt.o; do
  if command -v cuobjdump > /dev/null; then
    echo "$o: HGMMA $(cuobjdump -sass $o | grep -c HGMMA) LDL/STL $(cuobjdump -sass $o | grep -cE 'LDL|STL')" >> "$OUT/sass.txt"
  fi
done
grep -h -A2 "sm90_kernel" build/fwd_sm90_*.ptxas.log | grep -E "registers|spill" > "$OUT/ptxas.txt"
OMP_NUM_THREADS=16 ./build/fwd_sm90_harness "$@" 2>&1 | tee "$OUT/harness.log" | grep -v "^PASS"
