#!/usr/bin/env bash
# One device call that times backend triton's kernel variants (tile shapes, warps, stages, tiles
# through tensor descriptors) side by side: install, compile every variant in parallel (one
# process per problem fills the Triton cache), GPU tests of both tile-load paths, then one timing
# process. Usage (on the GPU machine, repo root):
#   PROBLEMS=1,2,5,8 VARIANT_ARGS=--tma-only [TEST_ARGS=tests/test_triton_gpu.py] bash benchmarks/gpu_run_variants.sh
# Writes device.txt, variant_tests.log, variants.log and variants.json under $OUT.
set -o pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PROBLEMS=${PROBLEMS:-0,1,2,3,4,5,6,7,8,9}
began=$(date +%s)
{ nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm,driver_version --format=csv
  git rev-parse --short HEAD 2>/dev/null; git status --short -- backends benchmarks tests; date -u
  HALOATTN_CUDA=off python3 -m pip install --no-build-isolation --no-deps -e . -q 2>&1 | tail -3
  echo "install took $(( $(date +%s) - began )) s"; } 2>&1 | tee "$OUT/device.txt"

for i in ${PROBLEMS//,/ }; do
  python3 benchmarks/bench_kernel_variants.py --only "$i" --compile-only $VARIANT_ARGS > "/tmp/compile_$i.log" 2>&1 &
done
if [ -z "$SKIP_TESTS" ]; then
  # TEST_ARGS: which GPU tests (default: both tile-load paths); e.g. TEST_ARGS=tests/test_triton_gpu.py
  timeout ${TEST_TIMEOUT:-240} python3 -m pytest -m gpu -q -n ${TEST_WORKERS:-4} -p no:cacheprovider -rf ${TEST_VERBOSE:+-v} \
    ${TEST_ARGS:-tests/test_triton_gpu.py -k "per_load_path or bitwise"} > "$OUT/variant_tests.log" 2>&1
  echo "tests: exit $? after $(( $(date +%s) - began )) s"; tail -3 "$OUT/variant_tests.log"
fi
wait
echo "compiles done after $(( $(date +%s) - began )) s"; grep -l -i "error\|Traceback" /tmp/compile_*.log | xargs -r tail -5
timeout ${BENCH_TIMEOUT:-300} python3 benchmarks/bench_kernel_variants.py --only "$PROBLEMS" $VARIANT_ARGS \
  --json "$OUT/variants.json" 2>&1 | tee "$OUT/variants.log"
echo "whole run: $(( $(date +%s) - began )) s"
