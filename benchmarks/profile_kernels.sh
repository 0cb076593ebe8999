#!/usr/bin/env bash
# Nsight Compute profile of a backend's neighbourhood kernels on bench_neighborhood problems:
# where their time goes (tensor-pipe use, issue slots, warp stall reasons per issued
# instruction, memory), one call's launches each.
#   bash benchmarks/profile_kernels.sh [PROBLEMS] [KERNEL] [BACKEND] [PASS]
# PROBLEMS: comma list of bench_neighborhood.PROBLEMS indices (default 0,1); KERNEL: a
# HALOATTN_CUDA_FORWARD / HALOATTN_CUDA_BACKWARD value (default hopper); BACKEND: cuda (default)
# or triton; PASS: forward (default: the forward kernel) or backward (the backward's kernels:
# cuda's dQ and dK/dV passes, triton's dq_kernel and dkdv_kernel). Needs the module built
# (gpu_run_cuda.sh does it) and ncu; the clocks are left alone (--clock-control none), as the
# device notes ask. SAMPLING=1 profiles the last launch of the pass only (one kernel: for cuda's
# backward the key-major pass), with warp-stall sampling per instruction, and writes its SASS page
# (ncu_*_sass.csv) and stall_summary.py's digest of it (ncu_*_stalls.txt).
set -o pipefail
OUT=${OUT:-/tmp/haloattn_out}
mkdir -p "$OUT"
cd "$(dirname "$0")"
command -v ncu > /dev/null || export PATH=/usr/local/cuda/bin:$PATH
backend=${3:-cuda}
pass=${4:-forward}
if [ "$pass" = forward ]; then
  kernels="regex:forward_kernel"; launches=1
else
  kernels="regex:backward_kernel|dq_kernel|dkdv_kernel"; launches=2
fi
sampling=()
if [ -n "$SAMPLING" ]; then
  skip=$(( 2 * launches - 1 )); count=1
  sampling=(--section SourceCounters --import-source no -o /tmp/haloattn_ncu_report -f)
else
  skip=$launches; count=$launches
fi
for index in $(echo "${1:-0,1}" | tr ',' ' '); do
  HALOATTN_CUDA_FORWARD=${2:-hopper} HALOATTN_CUDA_BACKWARD=${2:-hopper} timeout 240 ncu --clock-control none \
    --kernel-name "$kernels" --launch-skip "$skip" --launch-count "$count" "${sampling[@]}" \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section SchedulerStats \
    --section WarpStateStats --section MemoryWorkloadAnalysis --section Occupancy \
    --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,regex:sm__pipe_.*(tensor|gmma|alu|fma|fp16).*cycles_active\.avg\.pct_of_peak_sustained_active,smsp__inst_executed.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,smsp__sass_inst_executed_op_shared_ld.sum,smsp__sass_inst_executed_op_local_ld.sum,smsp__sass_inst_executed_op_local_st.sum" \
    python3 -c "
import torch, haloattn
from bench_neighborhood import BATCH, HEADS, PROBLEMS
name, spatial, window, options, D = PROBLEMS[$index]
print(name)
q, k, v = (torch.randn(BATCH, *spatial, HEADS, D, device='cuda', dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
for _ in range(2):
    out = haloattn.attention(q, k, v, window, backend='$backend', **options)
    if '$pass' == 'backward':
        out.backward(torch.ones_like(out))
torch.cuda.synchronize()
" > "$OUT/ncu_${backend}_${pass}_problem_$index.txt" 2>&1
  if [ -n "$SAMPLING" ]; then
    name="$OUT/ncu_${backend}_${pass}_problem_$index"
    ncu -i /tmp/haloattn_ncu_report.ncu-rep --page details >> "$name.txt" 2>&1
    ncu -i /tmp/haloattn_ncu_report.ncu-rep --page source --csv --print-source sass > "${name}_sass.csv" 2>&1
    python3 stall_summary.py "${name}_sass.csv" | tee "${name}_stalls.txt"
    continue
  fi
  grep -E "^  [a-z_]+kernel|Function Name|backward_kernel<|Duration|Issue Slots Busy|Executed Ipc Active|No Eligible|issue_stalled|pipe_|inst_executed|wavefronts|Shared Memory|Compute \(SM\) Throughput|Memory Throughput" \
    "$OUT/ncu_${backend}_${pass}_problem_$index.txt" | awk '$NF+0 >= 0.05 || !/issue_stalled/' | cut -c1-160 | head -90
done
