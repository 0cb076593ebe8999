#!/usr/bin/env bash
# One device call: bench_wide_forward_tiles.py (the 16-bit forward's tiles at head dims above
# 128), its problems compiled first in parallel processes (Triton's disk cache then serves the
# timing run); then bench_kq_conv.py. Usage (GPU machine, repo root): [ONLY=0,2] [KQ_CONV=0] bash
# benchmarks/gpu_run_wide_forward.sh
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } | tee "$OUT/device.txt"
HALOATTN_CUDA=off python3 -m pip install -q --no-build-isolation --no-deps -e . > "$OUT/install.log" 2>&1 || { tail "$OUT/install.log"; exit 1; }
ONLY=${ONLY:-$(python3 -c "import sys; sys.path.insert(0, 'benchmarks'); import bench_wide_forward_tiles as b; print(','.join(map(str, range(len(b.PROBLEMS)))))")}
for i in ${ONLY//,/ }; do
  timeout ${COMPILE_TIMEOUT:-200} python3 benchmarks/bench_wide_forward_tiles.py --only "$i" > "$OUT/compile_$i.log" 2>&1 &
done
wait
echo "compiled at $(date -u +%T)"
timeout ${BENCH_TIMEOUT:-200} python3 benchmarks/bench_wide_forward_tiles.py --only "$ONLY" --json "$OUT/wide_forward.json" 2>&1 | tee "$OUT/wide_forward.log"
# The key-query convolution (reference backend, conv_tiles.py) against triton without it; KQ_CONV=0 skips.
if [ "${KQ_CONV:-1}" = 1 ]; then
  timeout ${KQ_TIMEOUT:-120} python3 benchmarks/bench_kq_conv.py --json "$OUT/kq_conv.json" 2>&1 | tee "$OUT/kq_conv.log"
fi
