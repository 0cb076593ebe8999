#!/usr/bin/env bash
# One device call: backend triton of this tree against another revision's (bench_against_revision.py),
# then GPU tests. Make the other revision's package first, on the machine that calls the device:
#   git archive <rev> backends/triton | tar -x -C ab_base    (ab_base/ listed in .git/info/exclude
#   and carried to the device)
# On the GPU machine, repo root:
#   [PROBLEMS=1,5] [AB_ARGS="--extra --rounds 3"] [TEST_ARGS=tests/test_triton_gpu.py] bash benchmarks/gpu_run_against_revision.sh
# Writes device.txt, against_revision.{log,json} and tests.log under $OUT.
set -o pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
BASE=${BASE:-ab_base/backends/triton}
PROBLEMS=${PROBLEMS:-0,1,2,3,4,5,6,7,8,9}
began=$(date +%s)
{ nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm,driver_version --format=csv; date -u
  HALOATTN_CUDA=off python3 -m pip install --no-build-isolation --no-deps -e . -q 2>&1 | tail -3
  echo "install took $(( $(date +%s) - began )) s"; } 2>&1 | tee "$OUT/device.txt"
# One process per problem fills the Triton cache in parallel; then one timing process.
for i in ${PROBLEMS//,/ }; do
  # shellcheck disable=SC2086
  python3 benchmarks/bench_against_revision.py --base "$BASE" --only "$i" $AB_ARGS --rounds 0 > "/tmp/ab_compile_$i.log" 2>&1 &
done
wait
echo "compiles done after $(( $(date +%s) - began )) s"; grep -l -i "error\|Traceback" /tmp/ab_compile_*.log | xargs -r tail -5
# shellcheck disable=SC2086
timeout ${BENCH_TIMEOUT:-240} python3 benchmarks/bench_against_revision.py --base "$BASE" --only "$PROBLEMS" $AB_ARGS \
  --json "$OUT/against_revision.json" 2>&1 | tee "$OUT/against_revision.log"
echo "timing done after $(( $(date +%s) - began )) s"
if [ -n "$TEST_ARGS" ]; then
  # shellcheck disable=SC2086
  timeout ${TEST_TIMEOUT:-300} python3 -m pytest -m gpu -q -n ${TEST_WORKERS:-6} -p no:cacheprovider -rf --timeout 250 \
    $TEST_ARGS > "$OUT/tests.log" 2>&1
  echo "tests: exit $? after $(( $(date +%s) - began )) s"; tail -4 "$OUT/tests.log"
fi
