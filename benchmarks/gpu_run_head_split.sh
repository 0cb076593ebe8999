#!/usr/bin/env bash
# One device call: the head-split forward against one padded block (bench_head_split.py), then
# the random GPU tests (new seeds: SEEDS), results under $OUT. Usage: bash benchmarks/gpu_run_head_split.sh
source "$(dirname "$0")/gpu_preamble.sh"
for d in ${DIMS:-80 160 192 256}; do python3 benchmarks/bench_head_split.py --compile-only --dims $d > /dev/null 2>$OUT/compile_$d.err & done; wait
echo "compile $(( $(date +%s) - s )) s" >> $OUT/device.txt
timeout 200 python3 benchmarks/bench_head_split.py --rounds 3 --json $OUT/head_split.json --markdown $OUT/head_split.md > $OUT/head_split.log 2>&1
echo "bench exit $? at $(( $(date +%s) - s )) s" >> $OUT/device.txt
cat $OUT/head_split.md
HALOATTN_RANDOM_SEEDS=${SEEDS:-3100:3150} timeout 250 python3 -m pytest -m gpu -q -n 10 -x tests/test_large_random_gpu.py tests/test_triton_gpu.py -k "random" > $OUT/gpu_tests.log 2>&1
echo "tests exit $? at $(( $(date +%s) - s )) s" >> $OUT/device.txt
tail -5 $OUT/gpu_tests.log; cat $OUT/device.txt; cat $OUT/compile_*.err | tail -20; rm -f $OUT/compile_*.err
