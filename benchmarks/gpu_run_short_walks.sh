#!/usr/bin/env bash
# One device call: query-tile boxes through Triton alone (probe_box_roundtrip.py); the forward's
# query tile and output through host descriptors, each half against pointers, what the query
# box feeds the tensor cores, and timed (probe_query_boxes.py); the triton GPU test suites
# (neighbourhood, window, mods, kq_conv, tiny random problems; -n 8, cut off by TEST_TIMEOUT);
# then the short-walk load rules re-measured now that undilated problems read their tiles through
# descriptors built on the host (bench_short_walks.py --flip, then --backward: each problem's
# default against its loads flipped).
# Files under $OUT: device.txt, box_roundtrip.log, query_boxes.log, short_walks_{forward,backward}.{json,log},
# gpu_tests.log.
#   bash benchmarks/gpu_run_short_walks.sh
source "$(dirname "$0")/gpu_preamble.sh"
timeout -s INT 90 python3 benchmarks/probe_box_roundtrip.py > "$OUT/box_roundtrip.log" 2>&1
echo "box round trip exit $? after $(( $(date +%s) - s )) s"; grep -v Warning "$OUT/box_roundtrip.log" | tail -40
timeout -s INT ${BOX_TIMEOUT:-150} python3 benchmarks/probe_query_boxes.py > "$OUT/query_boxes.log" 2>&1
echo "query boxes exit $? after $(( $(date +%s) - s )) s"; grep -v Warning "$OUT/query_boxes.log" | tail -12
if [ -z "$NO_TESTS" ]; then
  timeout -s INT ${TEST_TIMEOUT:-170} python3 -m pytest -m gpu -q -n 8 -p no:cacheprovider -rf --tb=short \
    tests/test_triton_gpu.py tests/test_window_gpu.py tests/test_triton_mods_gpu.py tests/test_triton_kq_conv_gpu.py \
    tests/test_tiny_random_gpu.py -k "not 2_31 and not smaller_gpus" > "$OUT/gpu_tests.log" 2>&1
  echo "GPU tests exit $? after $(( $(date +%s) - s )) s"; grep -E "passed|failed|FAILED|Error" "$OUT/gpu_tests.log" | tail -12
fi
for pass in forward backward; do
  flag=--flip; [ $pass = backward ] && flag=--backward
  timeout -s INT ${WALK_TIMEOUT:-75} python3 benchmarks/bench_short_walks.py $flag --json "$OUT/short_walks_$pass.json" \
    > "$OUT/short_walks_$pass.log" 2>&1
  echo "short walks $pass exit $? after $(( $(date +%s) - s )) s"; grep -v Warning "$OUT/short_walks_$pass.log" | tail -20
done
cat $OUT/device.txt
