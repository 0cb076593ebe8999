#!/usr/bin/env bash
# One device call for the triton neighbourhood backend: install, GPU tests, benchmark.
# Usage (on the GPU machine, repo root): bash benchmarks/gpu_run_neighborhood.sh [bench args...]
set -o pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.sm,driver_version --format=csv | tee "$OUT/device.txt"
git rev-parse --short HEAD 2>/dev/null | tee -a "$OUT/device.txt"
HALOATTN_CUDA=off python3 -m pip install --no-build-isolation --no-deps -e . -q 2>&1 | tail -3 | tee "$OUT/install.log"
if [ -z "$SKIP_TESTS" ]; then
  timeout ${TEST_TIMEOUT:-200} python3 -m pytest -m gpu -q -x -n 8 -p no:cacheprovider tests/test_triton_gpu.py 2>&1 | tail -40 | tee "$OUT/tests.log"
fi
timeout ${BENCH_TIMEOUT:-300} python3 benchmarks/bench_neighborhood.py --json "$OUT/bench.json" --markdown "$OUT/bench.md" "$@" 2>&1 | tee "$OUT/bench.log"
