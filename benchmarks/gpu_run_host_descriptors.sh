#!/usr/bin/env bash
# One device call: K/V descriptors built on the host against built by each program
# (bench_host_descriptors.py), then the forward's live-step lists held in registers
# (check_list_registers.py, bench_flex_mods.py --only mask_mod). Files under $OUT: device.txt,
# host_descriptors.{json,log}, list_registers.log, flex_mods_mask.{md,json,log}.
#   PASSES=forward bash benchmarks/gpu_run_host_descriptors.sh
source "$(dirname "$0")/gpu_preamble.sh"
timeout -s INT ${HOST_TIMEOUT:-330} python3 benchmarks/bench_host_descriptors.py --passes ${PASSES:-forward,backward} \
  --rounds ${ROUNDS:-3} ${ONLY:+--only $ONLY} --json "$OUT/host_descriptors.json" 2>&1 | tee "$OUT/host_descriptors.log" | grep -v Warning
echo "host descriptors exit $? after $(( $(date +%s) - s )) s"
if [ -z "$NO_LISTS" ]; then
  timeout -s INT 60 python3 benchmarks/check_list_registers.py > "$OUT/list_registers.log" 2>&1
  echo "list check exit $? after $(( $(date +%s) - s )) s"; cat "$OUT/list_registers.log" | tail -5
  timeout -s INT ${LIST_TIMEOUT:-150} python3 benchmarks/bench_flex_mods.py --no-reference --only mask_mod \
    --markdown "$OUT/flex_mods_mask.md" --json "$OUT/flex_mods_mask.json" > "$OUT/flex_mods_mask.log" 2>&1
  echo "flex mods exit $? after $(( $(date +%s) - s )) s"; cat "$OUT/flex_mods_mask.md" 2>/dev/null || tail -20 "$OUT/flex_mods_mask.log"
fi
