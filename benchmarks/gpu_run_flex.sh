#!/usr/bin/env bash
# One device call for mods on a GPU: install (no CUDA module), the GPU tests of the flex backend
# (compiled Flex against the float64 reference; xdist spreads Flex's compiles over the cores) and
# of the mods compiled into backend triton (tests/test_triton_mods_gpu.py), then
# bench_flex_mods.py. Files under $OUT: device.txt, flex_tests.log, flex_mods.{md,json}.
#   bash benchmarks/gpu_run_flex.sh          (SKIP_TESTS=1 / SKIP_BENCH=1 to leave one out; the bench
#   skips the slow reference column unless BENCH_ARGS says otherwise, BENCH_ARGS= includes it)
set -o pipefail
export PYTHONUNBUFFERED=1 HALOATTN_CUDA=off
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
began=$(date +%s)
stamp() { echo "[$(( $(date +%s) - began )) s] $*"; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  date -u; git log -1 --format=%h 2>/dev/null
  python3 -m pip install --no-build-isolation --no-deps -e . -q 2>&1 | tail -3
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
} 2>&1 | tee "$OUT/device.txt"
stamp "installed"
if [ -z "$SKIP_TESTS" ]; then
  timeout ${TEST_TIMEOUT:-370} python3 -m pytest -m gpu -q -n 8 -p no:cacheprovider -rf --tb=short tests/test_flex_gpu.py \
    tests/test_triton_mods_gpu.py > "$OUT/flex_tests.log" 2>&1
  stamp "flex tests: exit $?"; grep -E "passed|failed|FAILED|Error" "$OUT/flex_tests.log" | tail -25
fi
if [ -z "$SKIP_BENCH" ]; then
  timeout ${BENCH_TIMEOUT:-180} python3 benchmarks/bench_flex_mods.py --markdown "$OUT/flex_mods.md" --json "$OUT/flex_mods.json" \
    ${BENCH_ARGS---no-reference} 2>&1 | tail -12
  stamp "flex bench: exit $?"
fi
