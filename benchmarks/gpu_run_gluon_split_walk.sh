#!/usr/bin/env bash
# One device call for the Gluon forward's split walk: bench_gluon_split_walk.py's problems compiled
# in processes of their own (Triton's disk cache then serves the timing run) while the Gluon
# forward's GPU tests run (every tiling against the float64 oracle), then the timing in one quiet
# process, then (ISSUE_ONLY) the issue benchmark's rows on the same machine: triton and dense
# cuDNN, and with ISSUE_FLEX=1 Flex too (its compile phase in the background from the start).
# Usage (GPU machine, repo root):
#   [TESTS="tests/..." [TESTS_K="persistent or same_outputs"]] [ONLY=0,1] [TILINGS=whole,split128x3] \
#     [ISSUE_ONLY=1,2 [ISSUE_FLEX=1]] \
#     bash benchmarks/gpu_run_gluon_split_walk.sh
# Knobs: COMPILE_TIMEOUT, TESTS_TIMEOUT, BENCH_TIMEOUT, ISSUE_TIMEOUT, FLEX_COMPILE_TIMEOUT (seconds).
source benchmarks/gpu_preamble.sh
flex=--no-flex
if [ -n "$ISSUE_ONLY" ] && [ -n "$ISSUE_FLEX" ]; then
  timeout $(( ${FLEX_COMPILE_TIMEOUT:-150} + 60 )) python3 benchmarks/bench_neighborhood.py --only "$ISSUE_ONLY" \
    --flex-compile-only "$OUT/flex_compiled.json" --flex-compile-timeout ${FLEX_COMPILE_TIMEOUT:-150} \
    > /tmp/flex_compile.log 2>&1 &
  flex="--flex-compile-status $OUT/flex_compiled.json"
fi
count=$(python3 -c "import sys; sys.path.insert(0, 'benchmarks'); import bench_gluon_split_walk as b; print(len(b.PROBLEMS))")
only=${ONLY:-$(seq -s, 0 $((count - 1)))}
tilings=${TILINGS:+--tilings $TILINGS}
for i in ${only//,/ }; do
  # shellcheck disable=SC2086
  timeout ${COMPILE_TIMEOUT:-200} python3 benchmarks/bench_gluon_split_walk.py --only "$i" $tilings > "/tmp/compile_split_$i.log" 2>&1 &
done
TESTS=${TESTS-tests/test_gluon_forward_gpu.py}
if [ -n "$TESTS" ]; then
  # (TESTS_K apart: a -k expression inside TESTS would be split at its spaces)
  # shellcheck disable=SC2086
  timeout ${TESTS_TIMEOUT:-300} python3 -m pytest -m gpu -q -n 4 -p no:cacheprovider -rf --tb=short $TESTS \
    ${TESTS_K:+-k "$TESTS_K"} > "$OUT/tests.log" 2>&1
  echo "tests: exit $? after $(( $(date +%s) - s )) s"; grep -E "passed|failed|error|FAILED" "$OUT/tests.log" | tail -30
fi
wait
echo "compiled after $(( $(date +%s) - s )) s"; tail -n 3 /tmp/compile_split_*.log | grep -iE "error|Traceback" | head
# shellcheck disable=SC2086
timeout ${BENCH_TIMEOUT:-200} python3 benchmarks/bench_gluon_split_walk.py --only "$only" $tilings --json "$OUT/split_walk.json" 2>&1 | tee "$OUT/split_walk.log"
if [ -n "$ISSUE_ONLY" ]; then
  # shellcheck disable=SC2086
  timeout ${ISSUE_TIMEOUT:-200} python3 benchmarks/bench_neighborhood.py $flex --only "$ISSUE_ONLY" \
    --json "$OUT/issue.json" --markdown "$OUT/issue.md" > "$OUT/issue.log" 2>&1
  echo "issue benchmark: exit $? after $(( $(date +%s) - s )) s"; cut -d'|' -f2-8 "$OUT/issue.md" 2>/dev/null
fi
