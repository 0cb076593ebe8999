#!/usr/bin/env bash
# One device call for the figures the open issues ask for, on the current tree: the cuda module
# built for sm_90a, then FlexAttention's compile phase for the neighbourhood benchmark in the
# background (CPU work, filling the on-disk caches) while GPU tests run (TESTS, default the two
# torch.compile(fullgraph=True) tests of the compiled backends, the compile tests and the core's
# GPU paths, CPU and GPU tests alike), then, with the machine quiet,
# the issue's benchmark (bench_neighborhood.py: triton, Flex, dense cuDNN) and the cuda
# backend's (bench_cuda.py: cuda beside triton and cuDNN). Files under $OUT: device.txt,
# tests.log, neighborhood.{md,json}, cuda_bench.json and the other logs in logs.tgz.
# Usage (GPU machine, repo root, the nvidia-cutlass wheel carried in .whl/):
#   bash benchmarks/gpu_run_issue_benchmarks.sh
# Knobs: TESTS (pytest selection; empty string: none), SKIP_CUDA_BENCH=1, ONLY (problem indices,
# both benchmarks), FLEX_COMPILE_TIMEOUT (seconds, default 150).
WITH_CUDA=1
source "$(dirname "$0")/gpu_preamble.sh"
stamp() { echo "$1 exit $2 at $(( $(date +%s) - s )) s, $(date -u +%H:%M:%S)" | tee -a $OUT/device.txt; }
stamp install 0
only=${ONLY:+--only $ONLY}

# shellcheck disable=SC2086
timeout 280 python3 benchmarks/bench_neighborhood.py --flex-compile-only $OUT/flex_compiled.json \
  --flex-compile-timeout ${FLEX_COMPILE_TIMEOUT:-150} $only > $OUT/flex_compile.log 2>&1 &
flex_compile=$!
tests=${TESTS-tests/test_cuda_gpu.py::test_compiles_with_fullgraph tests/test_flex_gpu.py::test_inside_a_compiled_model tests/test_compile.py tests/test_gpu_core_paths.py}
if [ -n "$tests" ]; then
  # shellcheck disable=SC2086
  timeout 240 python3 -m pytest -m "gpu or not gpu" -q -p no:benchmark -p no:cacheprovider -rA --tb=short $tests > $OUT/tests.log 2>&1
  stamp tests $?
  grep -E "^(PASSED|FAILED|ERROR)|passed|failed" $OUT/tests.log | tail -12
fi
wait $flex_compile
stamp flex_compile $?

# shellcheck disable=SC2086
timeout 300 python3 benchmarks/bench_neighborhood.py --flex-compile-status $OUT/flex_compiled.json $only \
  --markdown $OUT/neighborhood.md --json $OUT/neighborhood.json > $OUT/neighborhood.log 2>&1
stamp neighborhood $?
cat $OUT/neighborhood.md
if [ -z "$SKIP_CUDA_BENCH" ]; then
  # shellcheck disable=SC2086
  timeout 200 python3 benchmarks/bench_cuda.py --no-portable ${ONLY:+--only $ONLY} --json $OUT/cuda_bench.json \
    > $OUT/cuda_bench.log 2>&1
  stamp cuda_bench $?
  tail -14 $OUT/cuda_bench.log
fi
cat $OUT/device.txt
# The device tool returns at most eight files: the logs travel as one archive.
logs=$(cd $OUT && ls install.log flex_compile.log flex_compiled.json neighborhood.log cuda_bench.log 2>/dev/null)
(cd $OUT && tar czf logs.tgz $logs && rm -f $logs)
