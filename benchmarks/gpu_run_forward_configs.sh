#!/usr/bin/env bash
# One device call: bench_forward_configs.py over SETS (default "narrow_1d narrow_nd"), each
# problem compiled first in a process of its own (Triton's disk cache then serves the timing
# runs), then every set timed in one quiet process each. Usage (GPU machine, repo root):
# [SETS="narrow_1d"] [TESTS="tests/..."] [BENCH_ARGS=--backward] bash benchmarks/gpu_run_forward_configs.sh
# TESTS: a pytest selection run under -m gpu while the problems compile (HALOATTN_RANDOM_SEEDS
# passes through).
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; git rev-parse --short HEAD; date -u; } | tee "$OUT/device.txt"
HALOATTN_CUDA=off python3 -m pip install -q --no-build-isolation --no-deps -e . > "$OUT/install.log" 2>&1 || { tail "$OUT/install.log"; exit 1; }
SETS=${SETS:-narrow_1d narrow_nd}
for set in $SETS; do
  count=$(python3 -c "import sys; sys.path.insert(0, 'benchmarks'); import bench_forward_configs as b; print(len(b.SETS['$set']))")
  for ((i = 0; i < count; i++)); do
    timeout ${COMPILE_TIMEOUT:-200} python3 benchmarks/bench_forward_configs.py --set "$set" --only "$i" $BENCH_ARGS > "$OUT/compile_${set}_$i.log" 2>&1 &
  done
done
if [ -n "$TESTS" ]; then
  # shellcheck disable=SC2086
  timeout ${TESTS_TIMEOUT:-200} python3 -m pytest -m gpu -q -n 4 -p no:cacheprovider -rf --tb=short $TESTS > "$OUT/tests.log" 2>&1
  echo "tests: exit $? at $(date -u +%T)"; tail -4 "$OUT/tests.log"
fi
wait
echo "compiled at $(date -u +%T)"
for set in $SETS; do
  timeout ${BENCH_TIMEOUT:-200} python3 benchmarks/bench_forward_configs.py --set "$set" --json "$OUT/$set.json" $BENCH_ARGS 2>&1 | tee "$OUT/$set.log"
done
