#!/usr/bin/env bash
# One device call for the Gluon dK/dV pass: bench_gluon_dkdv.py's problems compiled in processes
# of their own (Triton's disk cache then serves the timing run) while the GPU tests run, then the
# A/B timing in one quiet process. Usage (GPU machine, repo root):
# [TESTS="tests/..."] [ONLY=0,1] [ISSUE_ONLY=0,1] bash benchmarks/gpu_run_gluon_dkdv.sh
source benchmarks/gpu_preamble.sh
count=$(python3 -c "import sys; sys.path.insert(0, 'benchmarks'); import bench_gluon_dkdv as b; print(len(b.PROBLEMS))")
only=${ONLY:-$(seq -s, 0 $((count - 1)))}
for i in ${only//,/ }; do
  timeout ${COMPILE_TIMEOUT:-240} python3 benchmarks/bench_gluon_dkdv.py --only "$i" $BENCH_ARGS > "/tmp/compile_dkdv_$i.log" 2>&1 &
done
TESTS=${TESTS:-tests/test_gluon_dkdv_gpu.py}
# shellcheck disable=SC2086
timeout ${TESTS_TIMEOUT:-220} python3 -m pytest -m gpu -q -n 4 -p no:cacheprovider -rf --tb=short $TESTS > "$OUT/tests.log" 2>&1
echo "tests: exit $? after $(( $(date +%s) - s )) s"; grep -E "passed|failed|error" "$OUT/tests.log" | tail -3
wait
echo "compiled after $(( $(date +%s) - s )) s"
timeout ${BENCH_TIMEOUT:-200} python3 benchmarks/bench_gluon_dkdv.py --only "$only" $BENCH_ARGS --json "$OUT/gluon_dkdv.json" 2>&1 | tee "$OUT/gluon_dkdv.log"
if [ -n "$ISSUE_ONLY" ]; then
  # the issue benchmark's triton rows on the same machine (bench_neighborhood.py, no Flex)
  timeout ${ISSUE_TIMEOUT:-200} python3 benchmarks/bench_neighborhood.py --no-flex --only "$ISSUE_ONLY" \
    --json "$OUT/issue.json" --markdown "$OUT/issue.md" > "$OUT/issue.log" 2>&1
  echo "issue benchmark: exit $? after $(( $(date +%s) - s )) s"; cat "$OUT/issue.md" 2>/dev/null | cut -d'|' -f2-8
fi
