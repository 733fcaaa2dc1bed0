#!/usr/bin/env bash
# Build the compute-sanitizer drivers of the warp-specialised Hopper kernels
# with their units (bf16, sm_90a) and run memcheck, racecheck and synccheck:
#   fwd: tests/cuda/fwd_sm90_sanitize.cu, head dims 64/128/256, plain, masks and logits variants;
#   bwd: tests/cuda/bwd_sm90_sanitize.cu, head dims 64/128 (plain, masks and logits variants) and 256
#        (plain, atomic and deterministic).
# Exits non-zero on any report or failed case.
#   LOG_DIR=... bash tests/cuda/sanitize_sm90.sh [fwd] [bwd]   (default: both)
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-/tmp/jf_sanitize_sm90}
LOG=${LOG_DIR:-$BUILD}
CUTE_INC=${CUTE_INC:-}
[ -n "$CUTE_INC" ] || CUTE_INC=$(python3 -c "import cutlass_library,os;print(os.path.join(os.path.dirname(cutlass_library.__file__),'source','include'))")
FLAGS=(-std=c++17 -O3 --expt-relaxed-constexpr --use_fast_math -gencode=arch=compute_90a,code=sm_90a -I cpp -I "$CUTE_INC")
status=0
for dir in ${*:-fwd bwd}; do
  case $dir in
    fwd) units="fwd_sm90_hdim64_bf16 fwd_sm90_hdim128_bf16 fwd_sm90_hdim256_bf16 fwd_sm90_masks_hdim64_bf16 fwd_sm90_masks_hdim128_bf16 fwd_sm90_masks_hdim256_bf16 fwd_sm90_logits_hdim64_bf16 fwd_sm90_logits_hdim128_bf16 fwd_sm90_logits_dropout_hdim64_bf16 fwd_sm90_logits_dropout_hdim128_bf16 fwd_sm90_logits_dropout_hdim256_bf16" ;;
    bwd) units="bwd_sm90_hdim64_bf16 bwd_sm90_hdim128_bf16 bwd_sm90_hdim256_bf16 bwd_sm90_masks_hdim64_bf16 bwd_sm90_masks_hdim128_bf16 bwd_sm90_logits_hdim64_bf16 bwd_sm90_logits_hdim128_bf16 bwd_sm90_logits_dropout_hdim64_bf16 bwd_sm90_logits_dropout_hdim128_bf16 bwd_sm90_masks_seg_order_hdim64_bf16 bwd_sm90_masks_seg_order_hdim128_bf16 bwd_sm90_masks_seg_order_hdim256_bf16 bwd_sm90_logits_seg_order_hdim64_bf16 bwd_sm90_logits_seg_order_hdim128_bf16 bwd_sm90_logits_seg_order_hdim256_bf16 bwd_sm90_logits_dropout_seg_order_hdim64_bf16 bwd_sm90_logits_dropout_seg_order_hdim128_bf16 bwd_sm90_logits_dropout_seg_order_hdim256_bf16 bwd_sm90_masks_hdim256_bf16 bwd_sm90_logits_hdim256_bf16 bwd_sm90_logits_dropout_hdim256_bf16" ;;
    *) echo "unknown kernel set: $dir (fwd or bwd)"; exit 2 ;;
  esac
  out="$BUILD/$dir"
  mkdir -p "$out" "$LOG"
  pids=()
  for u in $units; do
    nvcc "${FLAGS[@]}" -c "cpp/cuda/instantiations/$u.cu" -o "$out/$u.o" & pids+=($!)
  done
  nvcc "${FLAGS[@]}" -c "tests/cuda/${dir}_sm90_sanitize.cu" -o "$out/driver.o" & pids+=($!)
  for p in "${pids[@]}"; do wait "$p"; done
  nvcc "${FLAGS[@]}" "$out"/*.o -o "$out/${dir}_sm90_sanitize"
  for tool in memcheck racecheck synccheck; do
    log="$LOG/sanitize_sm90_${dir}_$tool.log"
    if ! compute-sanitizer --tool "$tool" --error-exitcode 99 "$out/${dir}_sm90_sanitize" >"$log" 2>&1; then
      echo "compute-sanitizer $tool ($dir): FAILED (see $log)"
      status=1
    elif ! grep -qE "(ERROR SUMMARY: 0 errors|RACECHECK SUMMARY: 0 hazards)" "$log"; then
      echo "compute-sanitizer $tool ($dir): no clean summary (see $log)"
      status=1
    else
      echo "compute-sanitizer $tool ($dir): clean"
    fi
    tail -n 2 "$log"
  done
done
exit $status
