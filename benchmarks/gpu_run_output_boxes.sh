#!/usr/bin/env bash
# One device call for the forward's output box (launch.HOST_QUERY_BOXES["output"]): the query-box
# probe (probe_query_boxes.py: each half against pointers, what the query box feeds the tensor
# cores, and pointers / output box / both timed on the issue's forward problems), the triton GPU
# test suites on the tree's defaults (-n 8), then the issue benchmark without Flex
# (bench_neighborhood.py --no-flex: triton against dense cuDNN, forward and forward + backward).
# Files under $OUT: device.txt, query_boxes.log, gpu_tests.log, neighborhood.{md,json,log}.
#   bash benchmarks/gpu_run_output_boxes.sh
source "$(dirname "$0")/gpu_preamble.sh"
timeout -s INT ${BOX_TIMEOUT:-200} python3 benchmarks/probe_query_boxes.py > "$OUT/query_boxes.log" 2>&1
echo "query boxes exit $? after $(( $(date +%s) - s )) s"; grep -v Warning "$OUT/query_boxes.log" | tail -30
timeout -s INT ${TEST_TIMEOUT:-200} python3 -m pytest -m gpu -q -n 8 -p no:cacheprovider -rf --tb=short \
  tests/test_triton_gpu.py tests/test_window_gpu.py tests/test_triton_mods_gpu.py tests/test_triton_kq_conv_gpu.py \
  tests/test_tiny_random_gpu.py -k "not 2_31 and not smaller_gpus" > "$OUT/gpu_tests.log" 2>&1
echo "GPU tests exit $? after $(( $(date +%s) - s )) s"; grep -E "passed|failed|FAILED|Error" "$OUT/gpu_tests.log" | tail -12
timeout -s INT ${BENCH_TIMEOUT:-150} python3 benchmarks/bench_neighborhood.py --no-flex --markdown $OUT/neighborhood.md \
  --json $OUT/neighborhood.json > $OUT/neighborhood.log 2>&1
echo "neighborhood exit $? after $(( $(date +%s) - s )) s"; cat $OUT/neighborhood.md
cat $OUT/device.txt
