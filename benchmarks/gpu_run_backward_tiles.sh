#!/usr/bin/env bash
# One device call: a backward-tile bench (BENCH: bench_wide_backward_tiles, the 16-bit backward's
# tiles at 144-256 channels, by default; bench_backward_shapes, its tile shapes at 32-128), dQ and
# dK/dV timed apart, its kernels compiled first in parallel workers while the GPU tests (TESTS, a
# pytest -k expression over the triton and JVP GPU tests; none if empty) run, into $OUT.
# Usage (GPU machine, repo root): bash benchmarks/gpu_run_backward_tiles.sh
# Knobs: BENCH, ONLY (problem indices), RULE=1 (bench_wide_backward_tiles: the default against the
# config before the rule only), TESTS, COMPILE_TIMEOUT, BENCH_TIMEOUT, TEST_TIMEOUT (s).
source "$(dirname "$0")/gpu_preamble.sh"
stamp() { echo "$1 exit $2 at $(( $(date +%s) - s )) s, $(date -u +%H:%M:%S)" >> $OUT/device.txt; }
rule=${RULE:+--rule}
bench=${BENCH:-bench_wide_backward_tiles}
{ timeout ${COMPILE_TIMEOUT:-240} python3 benchmarks/$bench.py --compile-only --only "${ONLY:-}" $rule \
  --workers ${WORKERS:-15} > $OUT/${bench}_compile.log 2>&1; stamp compile $?; } &
if [ -n "$TESTS" ]; then
  timeout ${TEST_TIMEOUT:-240} python3 -m pytest -m gpu -q -n 8 -p no:benchmark tests/test_triton_gpu.py tests/test_jvp.py \
    -k "$TESTS" > $OUT/gpu_tests.log 2>&1
  stamp tests $?; tail -3 $OUT/gpu_tests.log
  grep -E "^(FAILED|ERROR)" $OUT/gpu_tests.log | head -10
fi
wait
grep -i "error\|Traceback" $OUT/${bench}_compile.log | head -5
timeout ${BENCH_TIMEOUT:-240} python3 benchmarks/$bench.py --only "${ONLY:-}" $rule \
  --json $OUT/$bench.json > $OUT/$bench.log 2>&1
stamp bench $?
grep "^|" $OUT/$bench.log
cat $OUT/device.txt
