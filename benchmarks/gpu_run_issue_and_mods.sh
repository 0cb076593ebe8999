#!/usr/bin/env bash
# One device call: both issues' benchmarks (gpu_run_issue_benchmarks.sh, no tests), then the GPU
# tests of the mods compiled into backend triton and bench_flex_mods.py (triton with and without
# its live-step lists and full flags, Flex). Files under $OUT: those of gpu_run_issue_benchmarks.sh,
# mods_tests.log, flex_mods.{md,json}, flex_mods.log.
#   bash benchmarks/gpu_run_issue_and_mods.sh      (the nvidia-cutlass wheel carried in .whl/)
TESTS="" bash "$(dirname "$0")/gpu_run_issue_benchmarks.sh"
OUT=${OUT:-/tmp/out}
s=$(date +%s)
timeout -s INT ${MODS_TEST_TIMEOUT:-110} python3 -m pytest -m gpu -q -n 12 -p no:cacheprovider -rf --tb=short \
  tests/test_triton_mods_gpu.py > "$OUT/mods_tests.log" 2>&1
echo "mods tests exit $? after $(( $(date +%s) - s )) s"; grep -E "passed|failed|FAILED|Error" "$OUT/mods_tests.log" | tail -8
timeout -s INT ${MODS_BENCH_TIMEOUT:-200} python3 benchmarks/bench_flex_mods.py --no-reference --markdown "$OUT/flex_mods.md" \
  --json "$OUT/flex_mods.json" > "$OUT/flex_mods.log" 2>&1
echo "flex mods bench exit $? after $(( $(date +%s) - s )) s"; cat "$OUT/flex_mods.md" 2>/dev/null || tail -20 "$OUT/flex_mods.log"
