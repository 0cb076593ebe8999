#!/usr/bin/env bash
# One device call for the mods compiled into backend triton: every GPU test of them
# (tests/test_triton_mods_gpu.py), then bench_flex_mods.py (triton with its live-step lists, walking
# every step, without the full flags; Flex; no reference). Files under $OUT: device.txt,
# mods_tests.log, flex_mods.{md,json,log}.
#   bash benchmarks/gpu_run_mods.sh      (MODS_TEST_TIMEOUT, MODS_BENCH_TIMEOUT: seconds)
source "$(dirname "$0")/gpu_preamble.sh"
timeout -s INT ${MODS_TEST_TIMEOUT:-200} python3 -m pytest -m gpu -q -n 14 -p no:cacheprovider -rf --tb=short \
  tests/test_triton_mods_gpu.py > "$OUT/mods_tests.log" 2>&1
echo "mods tests exit $? after $(( $(date +%s) - s )) s"; grep -E "passed|failed|FAILED|Error" "$OUT/mods_tests.log" | tail -8
timeout -s INT ${MODS_BENCH_TIMEOUT:-280} python3 benchmarks/bench_flex_mods.py --no-reference --markdown "$OUT/flex_mods.md" \
  --json "$OUT/flex_mods.json" > "$OUT/flex_mods.log" 2>&1
echo "flex mods bench exit $? after $(( $(date +%s) - s )) s"; cat "$OUT/flex_mods.md" 2>/dev/null || tail -20 "$OUT/flex_mods.log"
