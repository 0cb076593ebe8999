#!/usr/bin/env bash
# One device call: the GPU tests of the Gluon forward at 64 channels and of its exp2 split (both off
# in the backend until they pass: tiles.GLUON_FORWARD_HEAD_DIMS, GLUON_EXP2_SPLIT), their timing
# against the default Triton forward (bench_forward_configs.py --set gluon_narrow), then the issue
# benchmark with Flex (compiled in the background from the start), then GPU tests for the time left.
# Usage (GPU machine, repo root):
#   [ONLY=0,1,...] [ISSUE_ONLY=0,...,9] [TESTS="tests/..."] bash benchmarks/gpu_run_gluon_narrow.sh
# Knobs: SMOKE_TIMEOUT, BENCH_TIMEOUT, FLEX_COMPILE_TIMEOUT, ISSUE_TIMEOUT, TESTS_TIMEOUT (seconds).
source benchmarks/gpu_preamble.sh
source benchmarks/gpu_issue_and_tests.sh
ISSUE_ONLY=${ISSUE_ONLY-0,1,2,3,4,5,6,7,8,9}
flex_compile_in_background
timeout ${SMOKE_TIMEOUT:-150} python3 -m pytest -m gpu -q -x -p no:cacheprovider -n 4 \
  tests/test_gluon_forward_gpu.py -k "64_channels or exp2_split" > "$OUT/smoke.log" 2>&1
rc=$?; tail -3 "$OUT/smoke.log"; echo "smoke: exit $rc after $(( $(date +%s) - s )) s"
[ $rc = 0 ] || exit 1
only=()
[ -n "$ONLY" ] && only=(--only "$ONLY")
timeout ${BENCH_TIMEOUT:-150} python3 benchmarks/bench_forward_configs.py --set gluon_narrow "${only[@]}" \
  --json "$OUT/gluon_narrow.json" 2>&1 | tee "$OUT/gluon_narrow.log"
echo "gluon_narrow: after $(( $(date +%s) - s )) s"
issue_benchmark
gpu_tests
