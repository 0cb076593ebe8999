#!/usr/bin/env bash
# One device call per part of the whole GPU test suite (`pytest -m gpu`), on the tree's defaults,
# under xdist with one worker per two CPU cores less two (compiles dominate: a fresh machine
# compiles every kernel variant the tests touch). Triton's cache lives in the ignored folder
# .gpu_triton_cache/, which stays on a warm machine, so a second part reuses the first's kernels.
#   PART=1 bash benchmarks/gpu_run_every_test.sh   # the cuda module built; every file but the tiny random one
#   PART=2 bash benchmarks/gpu_run_every_test.sh   # tests/test_tiny_random_gpu.py (no cuda build)
# Knobs: TEST_TIMEOUT (seconds, default 520), WORKERS, SELECT (extra pytest arguments).
# Files under $OUT: device.txt, install.log, tests_part$PART.log (with the 40 slowest tests).
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
# shellcheck disable=SC2086
timeout -s INT ${TEST_TIMEOUT:-520} python3 -m pytest -m gpu -q -n $workers -p no:cacheprovider -p no:benchmark \
  -rfE --tb=short --durations=40 $files $SELECT > "$OUT/tests_part$PART.log" 2>&1
echo "part $PART: pytest exit $? after $(( $(date +%s) - s )) s" | tee -a $OUT/device.txt
grep -E "passed|failed|FAILED|ERROR" "$OUT/tests_part$PART.log" | tail -25
