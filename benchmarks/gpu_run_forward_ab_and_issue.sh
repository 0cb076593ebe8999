#!/usr/bin/env bash
# One device call for a kernel change: a smoke test first (exit on failure, so a hang does not eat
# the call), then this tree's forward (AB_PASSES=--no-forward: backward) against another
# revision's package side by side (bench_against_revision.py), then the issue benchmark (triton, dense cuDNN and,
# compiled in the background from the start, Flex), then GPU tests for what time is left.
# Make the other revision's package first (ab_base/ is in .git/info/exclude; carry it):
#   git archive <rev> backends/triton | tar -x -C ab_base
# Usage (GPU machine, repo root):
#   [SMOKE="tests/... -k expr"] [AB=0,1,...] [ISSUE_ONLY=0,...,9] [TESTS="tests/..."] \
#     [AB_PASSES=--no-forward] bash benchmarks/gpu_run_forward_ab_and_issue.sh
# Knobs: SMOKE_TIMEOUT, AB_TIMEOUT, ISSUE_TIMEOUT, TESTS_TIMEOUT, FLEX_COMPILE_TIMEOUT (seconds).
source benchmarks/gpu_preamble.sh
source benchmarks/gpu_issue_and_tests.sh
rm -f "$OUT/install.log"
ISSUE_ONLY=${ISSUE_ONLY-0,1,2,3,4,5,6,7,8,9}
flex_compile_in_background
if [ -n "$SMOKE" ]; then
  # shellcheck disable=SC2086
  eval timeout ${SMOKE_TIMEOUT:-200} python3 -m pytest -m gpu -q -x -p no:cacheprovider -n 4 $SMOKE > "$OUT/smoke.log" 2>&1
  rc=$?; tail -3 "$OUT/smoke.log"; echo "smoke: exit $rc after $(( $(date +%s) - s )) s"
  [ $rc = 0 ] || exit 1
fi
AB=${AB-0,1,2,3,4,5,6,7,8,9,10,11,12,13,14}
if [ -n "$AB" ]; then
  compiles=()
  for i in ${AB//,/ }; do
    timeout 200 python3 benchmarks/bench_against_revision.py --base ab_base/backends/triton --extra ${AB_PASSES---no-backward} \
      --only "$i" --rounds 0 > "/tmp/ab_compile_$i.log" 2>&1 &
    compiles+=($!)
  done
  wait "${compiles[@]}"  # (not the Flex compile)
  echo "A/B compiled after $(( $(date +%s) - s )) s"; grep -l -i "Traceback" /tmp/ab_compile_*.log | xargs -r tail -5
  timeout ${AB_TIMEOUT:-150} python3 benchmarks/bench_against_revision.py --base ab_base/backends/triton --extra \
    ${AB_PASSES---no-backward} --only "$AB" --rounds ${AB_ROUNDS:-3} --json "$OUT/against_revision.json" 2>&1 | tee "$OUT/against_revision.log"
  echo "A/B timed after $(( $(date +%s) - s )) s"
fi
issue_benchmark
gpu_tests
