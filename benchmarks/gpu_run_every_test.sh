#!/usr/bin/env bash
# One device call per part of the whole GPU test suite (`pytest -m gpu`), on the tree's defaults,
# under xdist with one worker per CPU core but two (compiles dominate: a fresh machine compiles
# every kernel variant the tests touch). Triton's cache lives in the ignored folder
# .gpu_triton_cache/, which stays on a warm machine, so a second part reuses the first's kernels.
#   PART=1 bash benchmarks/gpu_run_every_test.sh   # the cuda module built; every file but the tiny random one
#   PART=2 bash benchmarks/gpu_run_every_test.sh   # tests/test_tiny_random_gpu.py (no cuda build)
# Knobs: TEST_TIMEOUT (seconds, default 520), MEMORY_TEST_TIMEOUT (the device_memory tests, 240),
# WORKERS, SELECT (extra pytest arguments).
# Files under $OUT: device.txt, install.log, tests_part$PART.log (with the 40 slowest tests),
# tests_device_memory.log (part 1).
PART=${PART:-1}
[ "$PART" = 1 ] && WITH_CUDA=1
source "$(dirname "$0")/gpu_preamble.sh"
export TRITON_CACHE_DIR=$PWD/.gpu_triton_cache
mkdir -p "$TRITON_CACHE_DIR"
workers=${WORKERS:-$(( $(nproc) - 2 ))}
if [ "$PART" = 1 ]; then
  files=$(ls tests/test_*.py | grep -v test_tiny_random_gpu.py)
else
  files=tests/test_tiny_random_gpu.py
fi
echo "installed after $(( $(date +%s) - s )) s; $workers workers; $(ls $TRITON_CACHE_DIR | wc -l) cached kernels" | tee -a $OUT/device.txt
# The tests marked device_memory (tens of GiB each) run after the others, one at a time: beside
# 14 workers they ran out of memory even on an H200 (2026-12-06).
# shellcheck disable=SC2086
timeout -s INT ${TEST_TIMEOUT:-520} python3 -m pytest -m "gpu and not device_memory" -q -n $workers -p no:cacheprovider -p no:benchmark \
  -rfE --tb=short --durations=40 $files $SELECT > "$OUT/tests_part$PART.log" 2>&1
echo "part $PART: pytest exit $? after $(( $(date +%s) - s )) s" | tee -a $OUT/device.txt
grep -E "passed|failed|FAILED|ERROR" "$OUT/tests_part$PART.log" | tail -25
if [ "$PART" = 1 ]; then
  # shellcheck disable=SC2086
  timeout -s INT ${MEMORY_TEST_TIMEOUT:-240} python3 -m pytest -m "gpu and device_memory" -q -p no:cacheprovider \
    -p no:benchmark -rfE --tb=short --durations=10 $files > "$OUT/tests_device_memory.log" 2>&1
  echo "device-memory tests: pytest exit $? after $(( $(date +%s) - s )) s" | tee -a $OUT/device.txt
  grep -E "passed|failed|FAILED|ERROR" "$OUT/tests_device_memory.log" | tail -8
fi
