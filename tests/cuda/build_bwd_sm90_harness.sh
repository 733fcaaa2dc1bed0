#!/usr/bin/env bash
# Build tests/cuda/bwd_sm90_harness (sm_90a only) into $BUILD (default
# build/bwd90): the d128 SM80 backward units (fallback, deterministic mode,
# timing baseline), the d128 sm90 units and the harness. JOBS parallel nvcc.
# Objects are rebuilt only when their .cu is newer: FORCE=1 after header edits.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build/bwd90}
JOBS=${JOBS:-1}
CUTE_INC=${CUTE_INC:-$(python3 -c "import cutlass_library,os;print(os.path.dirname(cutlass_library.__file__))")/source/include}
GENCODE="-gencode arch=compute_90a,code=sm_90a"
FLAGS="-O3 -std=c++17 --expt-relaxed-constexpr --use_fast_math $GENCODE -I cpp -I $CUTE_INC"
mkdir -p "$BUILD"
srcs="cpp/cuda/instantiations/bwd_sm90_hdim128_bf16.cu cpp/cuda/instantiations/bwd_sm90_hdim128_fp16.cu
cpp/cuda/instantiations/bwd_hdim128_bf16.cu cpp/cuda/instantiations/bwd_hdim128_fp16.cu"
export FLAGS BUILD
printf '%s\n' $srcs | xargs -P "$JOBS" -I{} sh -c \
  'o="$BUILD/$(basename {} .cu).o"; if [ ! -f "$o" ] || [ {} -nt "$o" ] || [ -n "${FORCE:-}" ]; then t0=$(date +%s); nvcc $FLAGS -Xptxas -v -c {} -o "$o" > "$BUILD/$(basename {} .cu).ptxas.log" 2>&1 || { cat "$BUILD/$(basename {} .cu).ptxas.log"; exit 255; }; echo "compiled $(basename {} .cu) in $(( $(date +%s) - t0 )) s"; fi'
nvcc $FLAGS -I tests/cuda -Xcompiler -fopenmp -c tests/cuda/bwd_sm90_harness.cu -o "$BUILD/bwd_sm90_harness.o"
nvcc $GENCODE -Xcompiler -fopenmp "$BUILD"/bwd_sm90_harness.o $(for f in $srcs; do echo "$BUILD/$(basename "$f" .cu).o"; done) \
  -o "$BUILD/bwd_sm90_harness"
echo "built $BUILD/bwd_sm90_harness"
