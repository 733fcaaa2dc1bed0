#!/usr/bin/env bash
# A/B: main (.stage/x) vs vectorized row kernels (.stage/y). Builds both, benches
# interleaved, then the backward + variants GPU tests on B.
set -uo pipefail
R=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site
t0=$(date +%s)
b() {  # b NAME DIR VARIANT_DIMS
  (cd $2 && JAX_FLASH_CUDA=1 JAX_FLASH_CUDA_ARCHS=90a JAX_FLASH_CUDA_DTYPES=bf16 JAX_FLASH_CUDA_HEAD_DIMS="64;128" \
   JAX_FLASH_CUDA_VARIANT_HEAD_DIMS="$3" CMAKE_BUILD_PARALLEL_LEVEL=8 \
   python3 -m pip install -q --no-build-isolation --no-deps --no-compile --target /tmp/$1 . > $OUT/build_$1.log 2>&1; echo "build $1 rc=$? $(( $(date +%s)-t0 )) s")
}
b A $R/.stage/x 64 &
b B $R/.stage/y "64;128" &
wait
cd /tmp
for i in 1 2; do
  for v in A B; do
    PYTHONPATH=/tmp/$v:/tmp/site timeout 100 python3 -P $R/.stage/y/benchmarks/bench_attention.py --head-dims 64 128 \
      --seqlens 512 1024 2048 4096 --modes fwd_bwd --impls jax_flash jax_flash_det --out $OUT/ab_${v}$i.json 2>&1 | grep -v Warn > $OUT/ab_${v}$i.log
    echo "bench $v$i done $(( $(date +%s)-t0 )) s"
  done
done
(cd /tmp && PYTHONPATH=/tmp/B:/tmp/site python3 -P -m jax_flash --no-timing > $OUT/selfcheck_B.txt 2>&1; echo "selfcheck rc=$?"; tail -3 $OUT/selfcheck_B.txt)
cd $R/.stage/y && PYTHONPATH=/tmp/B:/tmp/site XLA_FLAGS=--xla_gpu_autotune_level=0 timeout $(( 585 - $(date +%s) + t0 )) python3 -P -m pytest -m gpu -n 8 -q -rfE \
  -k "not fp16" tests/test_cuda_backward.py tests/test_cuda_variants.py > $OUT/pytest_B.log 2>&1
echo "pytest rc=$? $(( $(date +%s)-t0 )) s"; tail -3 $OUT/pytest_B.log
