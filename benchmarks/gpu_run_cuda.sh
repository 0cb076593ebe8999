#!/usr/bin/env bash
# One device call for the compiled cuda backend: build haloattn_cuda._C for sm_90a, GPU tests
# against the oracle (and, if any fails, compute-sanitizer on one small forward + backward), then
# a short timing against triton and cuDNN.
# Usage (GPU machine, repo root, nvidia-cutlass importable): bash benchmarks/gpu_run_cuda.sh
set -o pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.sm,driver_version --format=csv | tee "$OUT/device.txt"
git rev-parse --short HEAD 2>/dev/null | tee -a "$OUT/device.txt"
date -u | tee -a "$OUT/device.txt"
start=$(date +%s)
if ! HALOATTN_CUDA=on python3 -m pip install --no-build-isolation --no-deps -e . -v > "$OUT/install.log" 2>&1; then
  grep -E "error|Error" "$OUT/install.log" | head -40
  tail -30 "$OUT/install.log"
  exit 1
fi
echo "install took $(( $(date +%s) - start )) s" | tee -a "$OUT/device.txt"
haloattn info 2>&1 | tee "$OUT/info.txt" | grep -A1 "cuda "
if ! timeout ${TEST_TIMEOUT:-150} python3 -m pytest -m gpu -q -n 8 -p no:cacheprovider --tb=line -rf \
    tests/test_cuda_gpu.py > "$OUT/tests.log" 2>&1; then
  tail -70 "$OUT/tests.log"
  timeout 45 compute-sanitizer --tool memcheck --print-limit 5 python3 -c "
import torch, haloattn
q, k, v = (torch.randn(1, 12, 13, 4, 64, device='cuda', dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
out = haloattn.attention(q, k, v, (5, 3), dilation=(2, 1), backend='cuda')
out.sum().backward()
torch.cuda.synchronize()
print('sanitizer run finished')
" 2>&1 | tail -25 | tee "$OUT/sanitizer.log"
else
  tail -5 "$OUT/tests.log"
fi
timeout ${BENCH_TIMEOUT:-90} python3 benchmarks/bench_cuda.py --only ${BENCH_PROBLEMS:-1,5,8} --json "$OUT/bench.json" 2>&1 | tee "$OUT/bench.log"
