#!/usr/bin/env bash
# One device call: where a training call's host time goes (bench_launch_overhead.py --split: the
# forward's and the backward's host time apart, and the device idle before the backward's first
# kernel), the per-kernel device time of 2-D 31x31 and 16x16 stride 16 (kernel_split.py), then the
# two-phase tuner on the blocked problem and 2-D 31x31 at 64 channels, each into a fresh cache,
# with the default's distance to the winner.
# Usage (GPU machine, repo root): bash benchmarks/gpu_run_host_and_tune.sh
source "$(dirname "$0")/gpu_preamble.sh"
stamp() { echo "$1 exit $2 at $(( $(date +%s) - s )) s, $(date -u +%H:%M:%S)" >> $OUT/device.txt; }

timeout 150 python3 benchmarks/bench_launch_overhead.py --split > $OUT/host_split.log 2>&1
stamp host_split $?
timeout 100 python3 benchmarks/kernel_split.py --only 1,8 > $OUT/kernel_split.log 2>&1
stamp kernel_split $?
HALOATTN_CACHE_DIR=$(mktemp -d) timeout 170 haloattn tune --shape 128x128 --window 16 --stride 16 --heads 16 \
  --batch 1 --head-dim 128 --backward > $OUT/tune_blocked_d128.log 2>&1
stamp tune_blocked $?
HALOATTN_CACHE_DIR=$(mktemp -d) timeout 150 haloattn tune --shape 128x128 --window 31 --heads 16 \
  --batch 1 --head-dim 64 --backward > $OUT/tune_31x31_d64.log 2>&1
stamp tune_31x31 $?
