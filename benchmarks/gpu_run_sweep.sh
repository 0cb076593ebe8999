#!/usr/bin/env bash
# One device call: build the cuda module for sm_90a, then bench_shape_sweep.py (off-list random
# problems through every fused backend beside dense cuDNN; see its docstring) into $OUT.
# Usage (GPU machine, repo root, the nvidia-cutlass wheel in .whl/): bash benchmarks/gpu_run_sweep.sh
# Knobs: SEEDS (start:stop), SWEEP_TIMEOUT (s), WORKERS (compile processes).
set -o pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
command -v nvcc > /dev/null || export PATH=/usr/local/cuda/bin:$PATH
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  git rev-parse --short HEAD 2>/dev/null
  git status --short | head -20
  date -u
} > "$OUT/device.txt"
python3 -m pip install -q --no-deps --no-index .whl/nvidia_cutlass-*.whl > /dev/null 2>&1
start=$(date +%s)
if ! HALOATTN_CUDA=on python3 -m pip install --no-build-isolation --no-deps -e . > "$OUT/install.log" 2>&1; then
  tail -30 "$OUT/install.log"
  exit 1
fi
echo "install took $(( $(date +%s) - start )) s" >> "$OUT/device.txt"
haloattn info 2>&1 | grep -A1 "cuda " >> "$OUT/device.txt"
timeout ${SWEEP_TIMEOUT:-480} python3 benchmarks/bench_shape_sweep.py --seeds "${SEEDS:-0:24}" \
  --workers "${WORKERS:-10}" --json "$OUT/sweep.json" --markdown "$OUT/sweep.md" > "$OUT/sweep.log" 2>&1
echo "sweep exit $?" >> "$OUT/device.txt"
tail -40 "$OUT/sweep.log"
