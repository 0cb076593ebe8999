#!/usr/bin/env bash
# One device call for the exact-float32 forward tiles (tiles.EXACT_FLOAT32_FORWARD_TILES): their
# GPU tests (forced 2-warp tiles, the wide default with every gradient, the float32 dtype cases)
# and the tiny random float32 problems on the default, then bench_float32_forward_tiles.py
# (every config side by side, each output against the float64 reference), into $OUT.
# Usage (GPU machine, repo root): bash benchmarks/gpu_run_float32_tiles.sh
# Knobs: BENCH_ONLY (problem indices, comma list), BENCH_TIMEOUT, TEST_TIMEOUT (s).
source "$(dirname "$0")/gpu_preamble.sh"
stamp() { echo "$1 exit $2 at $(( $(date +%s) - s )) s, $(date -u +%H:%M:%S)" >> $OUT/device.txt; }
timeout ${TEST_TIMEOUT:-240} python3 -m pytest -m gpu -q -n 14 -p no:benchmark tests/test_triton_gpu.py \
  tests/test_tiny_random_gpu.py -k "wide_float32 or two_warp or dtype2 or float32" > $OUT/float32_gpu_tests.log 2>&1
stamp float32_tests $?
tail -3 $OUT/float32_gpu_tests.log
timeout ${BENCH_TIMEOUT:-300} python3 benchmarks/bench_float32_forward_tiles.py --only "${BENCH_ONLY:-}" \
  --json $OUT/float32_forward_tiles.json > $OUT/float32_forward_tiles.log 2>&1
stamp bench $?
grep "^|" $OUT/float32_forward_tiles.log; cat $OUT/device.txt
