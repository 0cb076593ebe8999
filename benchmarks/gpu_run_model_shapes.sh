#!/usr/bin/env bash
# One device call: the problems shaped like models (bench_model_shapes.py, do_bench and CUDA-graph
# times of every fused backend against dense cuDNN) and where their device time goes
# (kernel_split.py --models, per kernel, against each pass's memory floor), into $OUT.
# Usage (GPU machine, repo root; carry .whl for the cuda module): WITH_CUDA=1 bash benchmarks/gpu_run_model_shapes.sh
# Knobs: ONLY (problem indices), BACKENDS (kernel_split backends, default "triton cuda"), TIMEOUT (s a step).
source "$(dirname "$0")/gpu_preamble.sh"
stamp() { echo "$1 exit $2 at $(( $(date +%s) - s )) s, $(date -u +%H:%M:%S)" >> $OUT/device.txt; }
only=${ONLY:+--only $ONLY}
timeout ${TIMEOUT:-300} python3 benchmarks/bench_model_shapes.py --cudagraph $only --json $OUT/model_shapes.json \
  --markdown $OUT/model_shapes.md > $OUT/model_shapes.log 2>&1
stamp model_shapes $?; cat $OUT/model_shapes.md; grep -i "error\|Traceback" $OUT/model_shapes.log | head -5
for backend in ${BACKENDS:-triton cuda}; do
  timeout ${TIMEOUT:-300} python3 benchmarks/kernel_split.py --models $only --backend $backend \
    --json $OUT/kernel_split_models_$backend.json > $OUT/kernel_split_models_$backend.log 2>&1
  stamp "kernel_split $backend" $?; cat $OUT/kernel_split_models_$backend.log | cut -c1-400
done
cat $OUT/device.txt
