#!/usr/bin/env bash
# One GPU call: the cuda module built, then the past-int32-offsets tests of both fused backends
# (tests/large_offsets.py, one at a time: each holds about 35 GB), every other cuda GPU test, the
# API edge cases' layouts through both compiled backends (tests/test_api_edges.py), and the random
# mid-size problems on RANDOM_SEEDS (default 3600:3660). Logs in $OUT.
# Usage (GPU machine, repo root, .whl/ holding the nvidia-cutlass wheel): bash benchmarks/gpu_run_large_offsets.sh
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
set -o pipefail; export PYTHONUNBUFFERED=1; command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH
python3 -m pip install -q --no-deps --no-index .whl/nvidia_cutlass-*.whl
s=$(date +%s); HALOATTN_CUDA=on python3 -m pip install -q --no-build-isolation --no-deps -e . > $OUT/install.log 2>&1 || { tail -20 $OUT/install.log; exit 1; }
echo "built in $(( $(date +%s) - s )) s"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt; date -u | tee -a $OUT/device.txt
timeout 240 python3 -m pytest -m gpu -q -p no:cacheprovider -k 2_31 --durations=8 tests/test_cuda_gpu.py tests/test_triton_gpu.py 2>&1 | tee $OUT/large_offsets.log | tail -15
timeout 200 python3 -m pytest -m gpu -q -n 8 -p no:cacheprovider -k "not 2_31" tests/test_cuda_gpu.py 2>&1 | tee $OUT/cuda_tests.log | tail -4
timeout 200 python3 -m pytest -m gpu -q -n 8 -p no:cacheprovider tests/test_api_edges.py 2>&1 | tee $OUT/api_edges_gpu.log | tail -4
HALOATTN_RANDOM_SEEDS=${RANDOM_SEEDS:-3600:3660} timeout 150 python3 -m pytest -m gpu -q -n 10 -p no:cacheprovider tests/test_large_random_gpu.py 2>&1 | tee $OUT/random_seeds.log | tail -4
