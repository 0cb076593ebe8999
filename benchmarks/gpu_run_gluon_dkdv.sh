#!/usr/bin/env bash
# One device call for a Gluon backward pass (PASS=dkdv, the default, or PASS=dq): a smoke test of
# it (SMOKE, pytest arguments; the call stops if it fails), bench_gluon_$PASS.py's problems
# compiled in processes of their own (Triton's disk cache then serves the timing run) while the
# GPU tests run, then the A/B timing in one quiet process, and the issue benchmark's triton rows.
# Usage (GPU machine, repo root):
# [PASS=dq] [SMOKE="tests/... -k ..."] [TESTS="tests/..."] [ONLY=0,1] [ISSUE_ONLY=0,1] bash benchmarks/gpu_run_gluon_dkdv.sh
source benchmarks/gpu_preamble.sh
PASS=${PASS:-dkdv}
bench=benchmarks/bench_gluon_$PASS.py
if [ -n "$SMOKE" ]; then
  # shellcheck disable=SC2086
  eval timeout ${SMOKE_TIMEOUT:-150} python3 -m pytest -m gpu -q -x -p no:cacheprovider --tb=short $SMOKE > "$OUT/smoke.log" 2>&1
  code=$?; echo "smoke: exit $code after $(( $(date +%s) - s )) s"; tail -30 "$OUT/smoke.log"
  [ $code -eq 0 ] || exit 1
fi
count=$(python3 -c "import sys; sys.path.insert(0, 'benchmarks'); import bench_gluon_dkdv as b; print(len(b.PROBLEMS))")
only=${ONLY:-$(seq -s, 0 $((count - 1)))}
for i in ${only//,/ }; do
  timeout ${COMPILE_TIMEOUT:-240} python3 $bench --only "$i" $BENCH_ARGS > "/tmp/compile_${PASS}_$i.log" 2>&1 &
done
TESTS=${TESTS:-tests/test_gluon_${PASS}_gpu.py}
# shellcheck disable=SC2086
timeout ${TESTS_TIMEOUT:-220} python3 -m pytest -m gpu -q -n 4 -p no:cacheprovider -rf --tb=short $TESTS > "$OUT/tests.log" 2>&1
echo "tests: exit $? after $(( $(date +%s) - s )) s"; grep -E "passed|failed|error" "$OUT/tests.log" | tail -12
wait
echo "compiled after $(( $(date +%s) - s )) s"
timeout ${BENCH_TIMEOUT:-200} python3 $bench --only "$only" $BENCH_ARGS --json "$OUT/gluon_$PASS.json" 2>&1 | tee "$OUT/gluon_$PASS.log"
if [ -n "$ISSUE_ONLY" ]; then
  # the issue benchmark's triton rows on the same machine (bench_neighborhood.py, no Flex)
  timeout ${ISSUE_TIMEOUT:-200} python3 benchmarks/bench_neighborhood.py --no-flex --only "$ISSUE_ONLY" \
    --json "$OUT/issue.json" --markdown "$OUT/issue.md" > "$OUT/issue.log" 2>&1
  echo "issue benchmark: exit $? after $(( $(date +%s) - s )) s"; cat "$OUT/issue.md" 2>/dev/null | cut -d'|' -f2-8
fi
