#!/usr/bin/env bash
# One device call: K/V, Q/dO and statistics descriptors built on the host against built by each
# program (bench_host_descriptors.py), then, with TESTS=1, the triton GPU tests (-n 8, cut off by
# TEST_TIMEOUT), and with MODS=1 the mask_mod problems of bench_flex_mods.py. Files under $OUT:
# device.txt, host_descriptors.{json,log}, triton_gpu_tests.log, flex_mods_mask.{md,json,log}.
#   PASSES=forward ONLY=1,5 bash benchmarks/gpu_run_host_descriptors.sh
source "$(dirname "$0")/gpu_preamble.sh"
timeout -s INT ${HOST_TIMEOUT:-330} python3 benchmarks/bench_host_descriptors.py --passes ${PASSES:-forward,backward} \
  --rounds ${ROUNDS:-3} ${ONLY:+--only $ONLY} --json "$OUT/host_descriptors.json" 2>&1 | tee "$OUT/host_descriptors.log" | grep -v Warning
echo "host descriptors exit $? after $(( $(date +%s) - s )) s"
if [ -n "$TESTS" ]; then
  timeout -s INT ${TEST_TIMEOUT:-200} python3 -m pytest -m gpu -q -n 8 -p no:cacheprovider -rf --tb=short \
    tests/test_triton_gpu.py -k "not 2_31 and not smaller_gpus" > "$OUT/triton_gpu_tests.log" 2>&1
  echo "triton GPU tests exit $? after $(( $(date +%s) - s )) s"; grep -E "passed|failed|FAILED|Error" "$OUT/triton_gpu_tests.log" | tail -8
fi
if [ -n "$MODS" ]; then
  timeout -s INT ${LIST_TIMEOUT:-150} python3 benchmarks/bench_flex_mods.py --no-reference --only mask_mod \
    --markdown "$OUT/flex_mods_mask.md" --json "$OUT/flex_mods_mask.json" > "$OUT/flex_mods_mask.log" 2>&1
  echo "flex mods exit $? after $(( $(date +%s) - s )) s"; cat "$OUT/flex_mods_mask.md" 2>/dev/null || tail -20 "$OUT/flex_mods_mask.log"
fi
