#!/usr/bin/env bash
# One device call for the exact-float32 tiles (float32 without TF32): their GPU tests (the
# forward's own tiles at every width, with every gradient at wide heads; the float32 dtype cases;
# the tiny random float32 problems), while bench_float32_backward_tiles.py compiles its kernels;
# then bench_float32_forward_tiles.py and bench_float32_backward_tiles.py (every config side by
# side, outputs and gradients checked), into $OUT.
# Usage (GPU machine, repo root): bash benchmarks/gpu_run_float32_tiles.sh
# Knobs: FORWARD_ONLY / BACKWARD_ONLY (problem indices, comma lists; SKIP_FORWARD=1 /
# SKIP_BACKWARD=1 leave a bench out), BENCH_TIMEOUT, TEST_TIMEOUT (s).
source "$(dirname "$0")/gpu_preamble.sh"
stamp() { echo "$1 exit $2 at $(( $(date +%s) - s )) s, $(date -u +%H:%M:%S)" >> $OUT/device.txt; }
[ -z "$SKIP_BACKWARD" ] && { timeout 300 python3 benchmarks/bench_float32_backward_tiles.py --compile-only \
  --only "${BACKWARD_ONLY:-}" > $OUT/float32_backward_compile.log 2>&1; stamp backward_compile $?; } &
timeout ${TEST_TIMEOUT:-240} python3 -m pytest -m gpu -q -n 12 -p no:benchmark tests/test_triton_gpu.py \
  tests/test_tiny_random_gpu.py -k "float32 or dtype2" > $OUT/float32_gpu_tests.log 2>&1
stamp float32_tests $?
tail -3 $OUT/float32_gpu_tests.log
wait
if [ -z "$SKIP_FORWARD" ]; then
timeout ${BENCH_TIMEOUT:-300} python3 benchmarks/bench_float32_forward_tiles.py --only "${FORWARD_ONLY:-}" \
  --json $OUT/float32_forward_tiles.json > $OUT/float32_forward_tiles.log 2>&1
stamp forward_bench $?
grep "^|" $OUT/float32_forward_tiles.log
fi
if [ -z "$SKIP_BACKWARD" ]; then
timeout ${BENCH_TIMEOUT:-300} python3 benchmarks/bench_float32_backward_tiles.py --only "${BACKWARD_ONLY:-}" \
  --json $OUT/float32_backward_tiles.json > $OUT/float32_backward_tiles.log 2>&1
stamp backward_bench $?
grep "^|" $OUT/float32_backward_tiles.log
fi
cat $OUT/device.txt
