#!/usr/bin/env bash
# One device call: the Gluon forward at 64 channels (a tuning candidate, tiles.GLUON_FORWARD_HEAD_DIMS)
# against the default Triton forward, then the issue benchmark with Flex (compiled in the
# background from the start), then GPU tests for the time left.
# Usage (GPU machine, repo root):
#   [ONLY=0,1,...] [ISSUE_ONLY=0,...,9] [TESTS="tests/..."] bash benchmarks/gpu_run_gluon_narrow.sh
# Knobs: SMOKE_TIMEOUT, BENCH_TIMEOUT, FLEX_COMPILE_TIMEOUT, ISSUE_TIMEOUT, TESTS_TIMEOUT (seconds).
source benchmarks/gpu_preamble.sh
ISSUE_ONLY=${ISSUE_ONLY-0,1,2,3,4,5,6,7,8,9}
if [ -n "$ISSUE_ONLY" ]; then
  timeout $(( ${FLEX_COMPILE_TIMEOUT:-150} + 60 )) python3 benchmarks/bench_neighborhood.py --only "$ISSUE_ONLY" \
    --flex-compile-only "$OUT/flex_compiled.json" --flex-compile-timeout ${FLEX_COMPILE_TIMEOUT:-150} \
    > /tmp/flex_compile.log 2>&1 &
fi
timeout ${SMOKE_TIMEOUT:-150} python3 -m pytest -m gpu -q -x -p no:cacheprovider -n 4 \
  tests/test_gluon_forward_gpu.py -k "64_channels" > "$OUT/smoke.log" 2>&1
rc=$?; tail -3 "$OUT/smoke.log"; echo "smoke: exit $rc after $(( $(date +%s) - s )) s"
[ $rc = 0 ] || exit 1
only=()
[ -n "$ONLY" ] && only=(--only "$ONLY")
timeout ${BENCH_TIMEOUT:-150} python3 benchmarks/bench_forward_configs.py --set gluon_narrow "${only[@]}" \
  --json "$OUT/gluon_narrow.json" 2>&1 | tee "$OUT/gluon_narrow.log"
echo "gluon_narrow: after $(( $(date +%s) - s )) s"
if [ -n "$ISSUE_ONLY" ]; then
  wait
  timeout ${ISSUE_TIMEOUT:-220} python3 benchmarks/bench_neighborhood.py --flex-compile-status "$OUT/flex_compiled.json" \
    --only "$ISSUE_ONLY" --json "$OUT/issue.json" --markdown "$OUT/issue.md" > "$OUT/issue.log" 2>&1
  echo "issue benchmark: exit $? after $(( $(date +%s) - s )) s"; cut -d'|' -f2-8 "$OUT/issue.md" 2>/dev/null
fi
if [ -n "$TESTS" ]; then
  # shellcheck disable=SC2086
  eval timeout ${TESTS_TIMEOUT:-150} python3 -m pytest -m gpu -q -n 4 -p no:cacheprovider -rf --tb=short $TESTS \
    > "$OUT/tests.log" 2>&1
  echo "tests: exit $? after $(( $(date +%s) - s )) s"; grep -E "passed|failed|error|FAILED" "$OUT/tests.log" | tail -20
fi
