#!/usr/bin/env bash
# One device call for the triton neighbourhood backend: install, GPU tests, benchmark.
# Usage (on the GPU machine, repo root): bash benchmarks/gpu_run_neighborhood.sh [bench args...]
# The benchmark's compile phase (haloattn kernels, tune candidates and FlexAttention, one worker
# per problem, bounded by FLEX_COMPILE_TIMEOUT) runs in the background while the tests run; the
# timing run then finds its caches warm. Knobs: SKIP_TESTS=1, TEST_TIMEOUT, BENCH_TIMEOUT,
# FLEX_COMPILE_TIMEOUT, CHECK_FLEX=1 (also during the compile phase: bench_neighborhood.py
# --check-flex cuda, Flex's mask against haloattn's rule pair by pair and Flex forward+backward on
# small problems against the reference backend; one more file, check_flex.log).
# At most 8 files under $OUT (the device tool's limit): tests.log, check_flex.log and --tune's
# bench_tune.json together make 9.
set -o pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
began=$(date +%s)
{ nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm,driver_version --format=csv
  git rev-parse --short HEAD 2>/dev/null
  git status --short -- backends/triton benchmarks/bench_neighborhood.py tests/test_triton_gpu.py
  date -u
  HALOATTN_CUDA=off python3 -m pip install --no-build-isolation --no-deps -e . -q 2>&1 | tail -3
  echo "install took $(( $(date +%s) - began )) s"; } 2>&1 | tee "$OUT/device.txt"

python3 benchmarks/bench_neighborhood.py --flex-compile-only "$OUT/flex_compile.json" \
  --flex-compile-timeout ${FLEX_COMPILE_TIMEOUT:-220} "$@" > "$OUT/flex_compile.log" 2>&1 &
compile_pid=$!

if [ -z "$SKIP_TESTS" ]; then
  timeout ${TEST_TIMEOUT:-200} python3 -m pytest -m gpu -q -n 6 -p no:cacheprovider --timeout 120 -rf \
    tests/test_triton_gpu.py > "$OUT/tests.log" 2>&1
  echo "tests: exit $? after $(( $(date +%s) - began )) s"; tail -5 "$OUT/tests.log"
fi
if [ -n "$CHECK_FLEX" ]; then
  timeout ${CHECK_TIMEOUT:-200} python3 benchmarks/bench_neighborhood.py --check-flex cuda "$@" > "$OUT/check_flex.log" 2>&1
  echo "check-flex: exit $? after $(( $(date +%s) - began )) s"; grep -v -i warn "$OUT/check_flex.log" | tail -20
fi
wait $compile_pid
echo "compile phase done after $(( $(date +%s) - began )) s"; grep -o '"flex_status": "[^"]*"' "$OUT/flex_compile.json" | sort | uniq -c
timeout ${BENCH_TIMEOUT:-300} python3 benchmarks/bench_neighborhood.py --flex-compile-status "$OUT/flex_compile.json" \
  --json "$OUT/bench.json" --markdown "$OUT/bench.md" "$@" 2>&1 | tee "$OUT/bench.log"
echo "whole run: $(( $(date +%s) - began )) s"
