#!/usr/bin/env bash
# One device call: float32 products, CUDA cores against three TF32 products
# (bench_float32_products.py), then the triton GPU tests' random problems (new seeds: SEEDS),
# results under $OUT. Usage: bash benchmarks/gpu_run_float32.sh
source "$(dirname "$0")/gpu_preamble.sh"
HALOATTN_RANDOM_SEEDS=${SEEDS:-3150:3200} timeout ${TEST_TIMEOUT:-240} python3 -m pytest -m gpu -q -n 10 \
  tests/test_large_random_gpu.py tests/test_triton_gpu.py tests/test_jvp.py -k "random or float32 or exact" > $OUT/gpu_tests.log 2>&1
echo "tests exit $? at $(( $(date +%s) - s )) s" >> $OUT/device.txt
tail -5 $OUT/gpu_tests.log
timeout ${BENCH_TIMEOUT:-300} python3 benchmarks/bench_float32_products.py --json $OUT/float32.json --markdown $OUT/float32.md > $OUT/float32.log 2>&1
echo "bench exit $? at $(( $(date +%s) - s )) s" >> $OUT/device.txt
cat $OUT/float32.md; cat $OUT/device.txt
