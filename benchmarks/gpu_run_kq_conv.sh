#!/usr/bin/env bash
# One GPU call for the fused key-query convolution: its GPU tests (tests/test_triton_kq_conv_gpu.py),
# then bench_kq_conv.py (fused against the reference path and the call without the convolution).
# Usage (GPU machine, repo root): bash benchmarks/gpu_run_kq_conv.sh; logs and JSON in $OUT.
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
set -o pipefail; export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-build-isolation --no-deps -e . > "$OUT/install.log" 2>&1 || { tail -20 "$OUT/install.log"; exit 1; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/device.txt"; date -u | tee -a "$OUT/device.txt"
timeout ${TEST_TIMEOUT:-300} python3 -m pytest -m gpu -q -n 8 -p no:cacheprovider --durations=8 \
  tests/test_triton_kq_conv_gpu.py 2>&1 | tee "$OUT/kq_conv_gpu_tests.log" | tail -8
timeout ${BENCH_TIMEOUT:-240} python3 benchmarks/bench_kq_conv.py --repeat ${REPEAT:-10} --json "$OUT/kq_conv.json" \
  2>&1 | tee "$OUT/kq_conv_bench.log"
