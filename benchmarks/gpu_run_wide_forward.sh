#!/usr/bin/env bash
# One device call: bench_wide_forward_tiles.py (the 16-bit forward's tiles at head dims above
# 128), its problems compiled first in parallel processes (Triton's disk cache then serves the
# timing run); then bench_kq_conv.py. Usage (GPU machine, repo root): [ONLY=0,2] [KQ_CONV=0] bash
# benchmarks/gpu_run_wide_forward.sh
# TESTS (a pytest selection, run -m "gpu" while the problems compile, before anything is timed):
# GPU tests that need no cuda module, e.g. TESTS="tests/test_gpu_core_paths.py tests/test_flex_gpu.py".
# WIDE_ARGS: more arguments of bench_wide_forward_tiles.py (e.g. "--skip 64x64w4s1").
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; git rev-parse --short HEAD; date -u; } | tee "$OUT/device.txt"
HALOATTN_CUDA=off python3 -m pip install -q --no-build-isolation --no-deps -e . > "$OUT/install.log" 2>&1 || { tail "$OUT/install.log"; exit 1; }
ONLY=${ONLY:-$(python3 -c "import sys; sys.path.insert(0, 'benchmarks'); import bench_wide_forward_tiles as b; print(','.join(map(str, range(len(b.PROBLEMS)))))")}
for i in ${ONLY//,/ }; do
  # shellcheck disable=SC2086
  timeout ${COMPILE_TIMEOUT:-200} python3 benchmarks/bench_wide_forward_tiles.py --only "$i" $WIDE_ARGS > "$OUT/compile_$i.log" 2>&1 &
done
if [ -n "$TESTS" ]; then
  # shellcheck disable=SC2086
  timeout ${TESTS_TIMEOUT:-200} python3 -m pytest -m gpu -q -n 4 -p no:cacheprovider -rf --tb=short $TESTS > "$OUT/tests.log" 2>&1
  echo "tests: exit $? at $(date -u +%T)"; tail -8 "$OUT/tests.log"
fi
wait
echo "compiled at $(date -u +%T)"
# shellcheck disable=SC2086
timeout ${BENCH_TIMEOUT:-200} python3 benchmarks/bench_wide_forward_tiles.py --only "$ONLY" $WIDE_ARGS --json "$OUT/wide_forward.json" 2>&1 | tee "$OUT/wide_forward.log"
# The key-query convolution (reference backend, conv_tiles.py) against triton without it; KQ_CONV=0 skips.
if [ "${KQ_CONV:-1}" = 1 ]; then
  timeout ${KQ_TIMEOUT:-120} python3 benchmarks/bench_kq_conv.py --json "$OUT/kq_conv.json" 2>&1 | tee "$OUT/kq_conv.log"
fi
