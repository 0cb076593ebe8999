#!/usr/bin/env bash
# One device call for the Gluon dK/dV pass: bench_gluon_dkdv.py's problems compiled in processes
# of their own (Triton's disk cache then serves the timing run) while the GPU tests run, then the
# A/B timing in one quiet process. Usage (GPU machine, repo root):
# [TESTS="tests/..."] [ONLY=0,1] bash benchmarks/gpu_run_gluon_dkdv.sh
source benchmarks/gpu_preamble.sh
count=$(python3 -c "import sys; sys.path.insert(0, 'benchmarks'); import bench_gluon_dkdv as b; print(len(b.PROBLEMS))")
only=${ONLY:-$(seq -s, 0 $((count - 1)))}
for i in ${only//,/ }; do
  timeout ${COMPILE_TIMEOUT:-240} python3 benchmarks/bench_gluon_dkdv.py --only "$i" > "/tmp/compile_dkdv_$i.log" 2>&1 &
done
TESTS=${TESTS:-tests/test_gluon_dkdv_gpu.py}
# shellcheck disable=SC2086
timeout ${TESTS_TIMEOUT:-300} python3 -m pytest -m gpu -q -n 4 -p no:cacheprovider -rf --tb=short $TESTS > "$OUT/tests.log" 2>&1
echo "tests: exit $? after $(( $(date +%s) - s )) s"; grep -E "passed|failed|error" "$OUT/tests.log" | tail -3
wait
echo "compiled after $(( $(date +%s) - s )) s"
timeout ${BENCH_TIMEOUT:-240} python3 benchmarks/bench_gluon_dkdv.py --only "$only" --json "$OUT/gluon_dkdv.json" 2>&1 | tee "$OUT/gluon_dkdv.log"
