#!/bin/sh
# CUDA compiler launcher for JAX_FLASH_CUDA_WGMMA_CHECK=ON: runs the nvcc
# command with ptxas' info output and fails the unit when ptxas serialised
# a kernel's wgmmas (the C751x "wgmma.mma_async instructions are serialized"
# notes: every wgmma then waits for the one before it, a silent 2-3x loss
# that only this note reveals). Other diagnostics pass through unchanged.
log=$(mktemp)
"$@" -Xptxas -v 2>"$log"
rc=$?
grep -v -e '^ptxas info' -e 'bytes stack frame' -e '^ptxas *: *info' "$log" >&2
serialised=$(grep 'wgmma.mma_async instructions are serialized' "$log")
if [ -n "$serialised" ]; then
  printf 'wgmma_check: ptxas serialised the wgmmas of a kernel in this unit:\n%s\n' "$serialised" >&2
  rc=1
fi
rm -f "$log"
exit $rc
