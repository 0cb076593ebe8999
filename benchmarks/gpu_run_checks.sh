#!/usr/bin/env bash
# One device call for the checks of a stop that changed no benchmark kernel: the tuning run of
# the 3-D head-dim-160 backward (is the default within the issue's 15 % of the tuned config?),
# bench_wide_backward_tiles.py, then, timed nothing after this point, the interpreter sweep's
# random problems through the compiled kernels (sweep_interpreter.py --gpu, float32 against the
# float64 oracle, in parallel processes; float32, then bfloat16 at split head dims), then the
# random mid-size GPU tests on new seeds, the tiny random problems compiled in every dtype
# (test_tiny_random_gpu.py) and the split-head test on 64-query tiles.
# Usage (GPU machine, repo root): bash benchmarks/gpu_run_checks.sh
# Knobs: SPLIT_SEEDS / SMALL_SEEDS (start:stop of the sweeps), RANDOM_SEEDS (the pytest sweep),
# SKIP_TIMING=1 (no tuning run or tile timing), ONLY_SWEEPS=1 (the sweeps alone), CUDA_SEEDS
# (start:stop: instead of all the above, the cuda module built and the sweeps run through it at
# its head dims in float16 and bfloat16, then the random mid-size tests, which include it; the
# nvidia-cutlass wheel carried in .whl/).
[ -n "$CUDA_SEEDS" ] && { WITH_CUDA=1; SKIP_TIMING=1; }
source "$(dirname "$0")/gpu_preamble.sh"
stamp() { echo "$1 exit $2 at $(( $(date +%s) - s )) s, $(date -u +%H:%M:%S)" >> $OUT/device.txt; }

if [ -z "$ONLY_SWEEPS$SKIP_TIMING" ]; then
HALOATTN_CACHE_DIR=$(mktemp -d) timeout 200 haloattn tune --shape 16x32x32 --window 5x9x9 --heads 8 --head-dim 160 \
  --batch 2 --backward > $OUT/tune_3d_hd160.log 2>&1
stamp tune $?
python3 - >> $OUT/tune_3d_hd160.log 2>&1 <<'PY'
import json, torch
from haloattn.problem import build_problem
from haloattn.backends.triton import tiles
q = torch.empty(2, 16, 32, 32, 8, 160, device="cuda", dtype=torch.bfloat16)
print("default:", json.dumps(tiles.default_config(build_problem(q, q, q, (5, 9, 9)))))
PY
timeout 100 python3 benchmarks/bench_wide_backward_tiles.py > $OUT/wide_backward_tiles.log 2>&1
stamp wide_tiles $?
fi

# sweep "start:stop" head-dims parts log: the seeds split over `parts` processes on the one GPU.
sweep() {
  local start=${1%:*} stop=${1#*:} dims=$2 parts=$3 log=$4 step pids=()
  step=$(( (stop - start + parts - 1) / parts ))
  for ((a = start; a < stop; a += step)); do
    b=$(( a + step < stop ? a + step : stop ))
    timeout 240 python3 benchmarks/sweep_interpreter.py $a $b --head-dims $dims --gpu $SWEEP_ARGS > $log.$a 2>&1 &
    pids+=($!)
  done
  wait "${pids[@]}"
  cat $log.* > $log; rm -f $log.*
}
if [ -n "$CUDA_SEEDS" ]; then
SWEEP_ARGS="--backend cuda --dtype bfloat16" sweep $CUDA_SEEDS 64,128 6 $OUT/sweep_gpu_cuda_bf16.log &
SWEEP_ARGS="--backend cuda --dtype float16" sweep $CUDA_SEEDS 64,128 6 $OUT/sweep_gpu_cuda_fp16.log &
wait
else
sweep ${SPLIT_SEEDS:-9000:9100} 48,72,80,144,160 5 $OUT/sweep_gpu_head_dims.log &
sweep ${SMALL_SEEDS:-8000:8100} 8,16,32 5 $OUT/sweep_gpu_small.log &
wait
SWEEP_ARGS="--dtype bfloat16" sweep ${SPLIT_SEEDS:-9000:9100} 48,72,80,144,160 5 $OUT/sweep_gpu_bf16_head_dims.log
fi
stamp sweeps 0
grep -h "FAIL\|Error\|error" $OUT/sweep_gpu_*.log | head -20
grep -c " OK" $OUT/sweep_gpu_*.log
grep -c " REFUSED" $OUT/sweep_gpu_*.log

[ -n "$ONLY_SWEEPS" ] && { cat $OUT/device.txt; exit 0; }
tests="tests/test_tiny_random_gpu.py tests/test_triton_gpu.py::test_split_head_dims_on_64_query_tiles"
[ -n "$CUDA_SEEDS" ] && tests=""  # cuda mode: the random mid-size tests alone (they run cuda too)
HALOATTN_RANDOM_SEEDS=${RANDOM_SEEDS:-3300:3380} timeout 300 python3 -m pytest -m gpu -q -n 14 -p no:benchmark \
  tests/test_large_random_gpu.py $tests > $OUT/random_tests.log 2>&1
stamp random_tests $?
tail -3 $OUT/random_tests.log; cat $OUT/device.txt; tail -4 $OUT/tune_3d_hd160.log | cut -c1-300; cat $OUT/wide_backward_tiles.log
