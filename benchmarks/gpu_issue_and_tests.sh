# Sourced by the one-call GPU scripts after gpu_preamble.sh: the issue benchmark with Flex (its
# compile started in the background first, as it takes minutes) and the GPU tests for the time left.
#   flex_compile_in_background   (ISSUE_ONLY: the issue rows, empty for none; FLEX_COMPILE_TIMEOUT)
#   issue_benchmark              (waits for the background jobs; ISSUE_TIMEOUT)
#   gpu_tests                    (TESTS: pytest arguments, eval'ed; TESTS_TIMEOUT)

flex_compile_in_background() {
  [ -n "$ISSUE_ONLY" ] || return 0
  timeout $(( ${FLEX_COMPILE_TIMEOUT:-150} + 60 )) python3 benchmarks/bench_neighborhood.py --only "$ISSUE_ONLY" \
    --flex-compile-only "$OUT/flex_compiled.json" --flex-compile-timeout ${FLEX_COMPILE_TIMEOUT:-150} \
    > /tmp/flex_compile.log 2>&1 &
}

issue_benchmark() {
  [ -n "$ISSUE_ONLY" ] || return 0
  wait
  timeout ${ISSUE_TIMEOUT:-220} python3 benchmarks/bench_neighborhood.py --flex-compile-status "$OUT/flex_compiled.json" \
    --only "$ISSUE_ONLY" --json "$OUT/issue.json" --markdown "$OUT/issue.md" > "$OUT/issue.log" 2>&1
  echo "issue benchmark: exit $? after $(( $(date +%s) - s )) s"; cut -d'|' -f2-8 "$OUT/issue.md" 2>/dev/null
}

gpu_tests() {
  [ -n "$TESTS" ] || return 0
  # shellcheck disable=SC2086
  eval timeout ${TESTS_TIMEOUT:-150} python3 -m pytest -m gpu -q -n 4 -p no:cacheprovider -rf --tb=short $TESTS \
    > "$OUT/tests.log" 2>&1
  echo "tests: exit $? after $(( $(date +%s) - s )) s"; grep -E "passed|failed|error|FAILED" "$OUT/tests.log" | tail -20
}
