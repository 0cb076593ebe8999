#!/usr/bin/env bash
# Nsight Compute profile of a backend's neighbourhood forward kernel on bench_neighborhood
# problems: where its time goes (tensor-pipe use, issue slots, warp stall reasons per issued
# instruction, memory), one launch each.
#   bash benchmarks/profile_cuda_forward.sh [PROBLEMS] [KERNEL] [BACKEND]
# PROBLEMS: comma list of bench_neighborhood.PROBLEMS indices (default 0,1); KERNEL: a
# HALOATTN_CUDA_FORWARD value (default hopper); BACKEND: cuda (default) or triton, whose forward
# kernel has the same name. Needs the module built (gpu_run_cuda.sh does it) and ncu; the clocks
# are left alone (--clock-control none), as the device notes ask.
set -o pipefail
OUT=${OUT:-/tmp/haloattn_out}
mkdir -p "$OUT"
cd "$(dirname "$0")"
command -v ncu > /dev/null || export PATH=/usr/local/cuda/bin:$PATH
backend=${3:-cuda}
for index in $(echo "${1:-0,1}" | tr ',' ' '); do
  HALOATTN_CUDA_FORWARD=${2:-hopper} timeout 240 ncu --clock-control none --kernel-name regex:forward_kernel \
    --launch-skip 1 --launch-count 1 \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section SchedulerStats \
    --section WarpStateStats --section MemoryWorkloadAnalysis --section Occupancy \
    --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,regex:sm__pipe_.*(tensor|gmma|alu|fma|fp16).*cycles_active\.avg\.pct_of_peak_sustained_active,smsp__inst_executed.sum" \
    python3 -c "
import torch, haloattn
from bench_neighborhood import BATCH, HEADS, PROBLEMS
name, spatial, window, options, D = PROBLEMS[$index]
print(name)
q, k, v = (torch.randn(BATCH, *spatial, HEADS, D, device='cuda', dtype=torch.bfloat16) for _ in range(3))
for _ in range(2):
    haloattn.attention(q, k, v, window, backend='$backend', **options)
torch.cuda.synchronize()
" > "$OUT/ncu_${backend}_problem_$index.txt" 2>&1
  grep -E "Duration|Issue Slots Busy|Executed Ipc Active|No Eligible|issue_stalled|pipe_|inst_executed" \
    "$OUT/ncu_${backend}_problem_$index.txt" | awk '$NF+0 >= 0.05 || !/issue_stalled/' | head -60
done
