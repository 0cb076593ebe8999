#!/usr/bin/env bash
# One device call: bench_small_query_tiles.py --small-windows (16- and 32-query tiles on small
# windows at head dims 64-256), its kernels compiled first in one process per problem while the
# GPU tests of the rules it measured run (TESTS, a pytest -k expression; none if empty), then the
# timed run, into $OUT.
# Usage (GPU machine, repo root): bash benchmarks/gpu_run_small_windows.sh
# Knobs: ONLY (problem indices), TESTS, RANDOM_SEEDS (start:stop, with TESTS: the random
# mid-size GPU tests too), TEST_TIMEOUT (s).
source "$(dirname "$0")/gpu_preamble.sh"
stamp() { echo "$1 exit $2 at $(( $(date +%s) - s )) s, $(date -u +%H:%M:%S)" >> $OUT/device.txt; }
indices=${ONLY:-0,1,2,3,4,5,6,7}
for i in ${indices//,/ }; do
  timeout 240 python3 benchmarks/bench_small_query_tiles.py --small-windows --only $i --compile-only > $OUT/compile_$i.log 2>&1 &
done
if [ -n "$TESTS" ]; then
  ${RANDOM_SEEDS:+env HALOATTN_RANDOM_SEEDS=$RANDOM_SEEDS} timeout ${TEST_TIMEOUT:-240} python3 -m pytest -m gpu -q -n 10 -p no:benchmark \
    tests/test_triton_gpu.py tests/test_tiny_random_gpu.py tests/test_large_random_gpu.py -k "$TESTS" > $OUT/gpu_tests.log 2>&1
  stamp tests $?; tail -3 $OUT/gpu_tests.log
fi
wait; stamp compile 0
cat $OUT/compile_*.log | grep -i "error\|Traceback" | head -5; cat $OUT/compile_*.log > $OUT/compile.log; rm -f $OUT/compile_*.log
timeout 300 python3 benchmarks/bench_small_query_tiles.py --small-windows --only $indices --json $OUT/small_windows.json \
  --markdown $OUT/small_windows.md > $OUT/small_windows.log 2>&1
stamp bench $?
cat $OUT/small_windows.md; cat $OUT/device.txt
