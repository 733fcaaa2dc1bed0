#!/usr/bin/env bash
# Build tests/cuda/bwd_harness (backward kernels + harness) into $BUILD
# (default build/bwd). ARCHS="80 90a" by default; JOBS parallel nvcc;
# HDIMS="64 128" builds only those head dims (plain + variants kernels).
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build/bwd}
ARCHS=${ARCHS:-"80 90a"}
JOBS=${JOBS:-$(nproc)}
CUTE_INC=${CUTE_INC:-$(python3 -c "import cutlass_library,os;print(os.path.dirname(cutlass_library.__file__))")/source/include}
GENCODE=$(for a in $ARCHS; do printf -- "-gencode arch=compute_%s,code=sm_%s " "$a" "$a"; done)
FLAGS="-O3 -std=c++17 --expt-relaxed-constexpr --use_fast_math $GENCODE -I cpp -I $CUTE_INC"
inst=$(ls cpp/cuda/instantiations/bwd_*.cu)
# The Hopper backward units (and their dispatch) only with 90a.
case " $ARCHS " in
  *" 90a "*) FLAGS="$FLAGS -DJAX_FLASH_BWD_SM90" ;;
  *) inst=$(printf '%s\n' $inst | grep -v '/bwd_sm90_') ;;
esac
if [ -n "${HDIMS:-}" ]; then
  FLAGS="$FLAGS -DJAX_FLASH_SELECTED_HEAD_DIMS $(for d in $HDIMS; do printf -- '-DJAX_FLASH_HDIM_%s ' "$d"; done)"
  inst=$(for d in $HDIMS; do ls cpp/cuda/instantiations/bwd_*hdim${d}_*.cu; done)
fi
mkdir -p "$BUILD"
srcs="cpp/cuda/bwd_launch.cu tests/cuda/bwd_alt.cu $inst"
export FLAGS BUILD
printf '%s\n' $srcs | xargs -P "$JOBS" -I{} sh -c \
  'o="$BUILD/$(basename {} .cu).o"; if [ ! -f "$o" ] || [ {} -nt "$o" ] || [ -n "${FORCE:-}" ]; then t0=$(date +%s); nvcc $FLAGS -Xptxas -v -c {} -o "$o" > "$BUILD/$(basename {} .cu).ptxas.log" 2>&1 || { cat "$BUILD/$(basename {} .cu).ptxas.log"; exit 255; }; echo "compiled $(basename {} .cu) in $(( $(date +%s) - t0 )) s"; fi'
nvcc $FLAGS -I tests/cuda -Xcompiler -fopenmp -c tests/cuda/bwd_harness.cu -o "$BUILD/bwd_harness.o"
objs=$(for f in $inst; do echo "$BUILD/$(basename "$f" .cu).o"; done)
nvcc $GENCODE -Xcompiler -fopenmp "$BUILD"/bwd_harness.o "$BUILD"/bwd_launch.o "$BUILD"/bwd_alt.o $objs -o "$BUILD/bwd_harness"
echo "built $BUILD/bwd_harness"
