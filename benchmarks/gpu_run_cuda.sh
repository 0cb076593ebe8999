#!/usr/bin/env bash
# One device call for the compiled cuda backend: build haloattn_cuda._C for sm_90a, GPU tests
# against the oracle (after a short forced-Hopper smoke run, so a hung kernel costs a minute; if
# anything fails, compute-sanitizer on one small forward + backward), then
# a timing against triton and dense cuDNN on bench_neighborhood's problems.
# Usage (GPU machine, repo root, nvidia-cutlass importable): bash benchmarks/gpu_run_cuda.sh
# Knobs: TEST_TIMEOUT, SKIP_TESTS=1, TESTS (pytest selection), BENCH_PROBLEMS (e.g. 1,5,8),
# BENCH_TIMEOUT, BENCH_ARGS (more bench_cuda.py arguments), SANITIZE=1 (run compute-sanitizer even when the
# tests pass).
set -o pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
command -v nvcc > /dev/null || export PATH=/usr/local/cuda/bin:$PATH
nvidia-smi --query-gpu=name,memory.total,clocks.sm,driver_version --format=csv | tee "$OUT/device.txt"
git rev-parse --short HEAD 2>/dev/null | tee -a "$OUT/device.txt"
git status --short -- csrc backends/cuda tests/test_cuda_gpu.py benchmarks/bench_cuda.py | tee -a "$OUT/device.txt"
date -u | tee -a "$OUT/device.txt"
start=$(date +%s)
if ! HALOATTN_CUDA=on python3 -m pip install --no-build-isolation --no-deps -e . -v > "$OUT/install.log" 2>&1; then
  grep -E "error|Error" "$OUT/install.log" | head -40
  tail -30 "$OUT/install.log"
  exit 1
fi
echo "install took $(( $(date +%s) - start )) s" | tee -a "$OUT/device.txt"
haloattn info 2>&1 | tee "$OUT/info.txt" | grep -A1 "cuda "

sanitize() {
  timeout ${SANITIZER_TIMEOUT:-60} compute-sanitizer --tool memcheck --print-limit 5 python3 -c "
import torch, haloattn
for spatial, window, opts, D in [((12, 13), (5, 3), dict(dilation=(2, 1)), 64), ((70,), 9, dict(stride=3, causal=True), 128),
                                  ((5, 6, 7), 3, dict(pattern='window', shift=1), 64)]:
    q, k, v = (torch.randn(1, *spatial, 4, D, device='cuda', dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    out, lse = haloattn.attention(q, k, v, window, backend='cuda', return_lse=True, **opts)
    (out.float().sum() + lse.sum()).backward()
torch.cuda.synchronize()
print('sanitizer run finished')
" 2>&1 | tail -30 | tee "$OUT/sanitizer.log"
}

# A few forced-Hopper calls under a short timeout first (cuda_smoke.py).
if ! timeout ${SMOKE_TIMEOUT:-90} python3 benchmarks/cuda_smoke.py 2>&1 | tee "$OUT/smoke.log"; then
  echo "smoke run failed or timed out"
  sanitize
  exit 1
fi

if [ -z "$SKIP_TESTS" ]; then
  if ! timeout ${TEST_TIMEOUT:-150} python3 -m pytest -m gpu -q -n 8 -p no:cacheprovider --timeout 100 --tb=short -rf \
      ${TESTS:-tests/test_cuda_gpu.py} > "$OUT/tests.log" 2>&1; then
    grep -E "^(FAILED|ERROR)|Error|error" "$OUT/tests.log" | head -40
    tail -8 "$OUT/tests.log"
    sanitize
  else
    tail -3 "$OUT/tests.log"
    [ -n "$SANITIZE" ] && sanitize
  fi
fi
timeout ${BENCH_TIMEOUT:-200} python3 benchmarks/bench_cuda.py --only ${BENCH_PROBLEMS:-0,1,2,3,4,5,6,7,8,9} ${BENCH_ARGS} \
  --json "$OUT/bench.json" 2>&1 | tee "$OUT/bench.log"
