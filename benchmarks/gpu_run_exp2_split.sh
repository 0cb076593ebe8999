#!/usr/bin/env bash
# One device call for the forward's exp2 split (exp2_split.py) and a backward change beside it:
# the exp2 GPU tests first (the call stops if they fail), then, compiled in parallel processes,
# bench_kernel_variants.py --exp2-only on narrow-head problems (every split, both rescaling rules,
# one process) and this tree's backward against another revision's package
# (bench_against_revision.py --no-forward; make ab_base/ first and carry it:
#   git archive <rev> backends/triton | tar -x -C ab_base), then GPU tests for the time left.
# Usage (GPU machine, repo root):
#   [VARIANTS=9,10,...] [AB=0,1,...] [TESTS="tests/..."] bash benchmarks/gpu_run_exp2_split.sh
# Knobs: SMOKE_TIMEOUT, VARIANTS_TIMEOUT, AB_TIMEOUT, TESTS_TIMEOUT (seconds).
source benchmarks/gpu_preamble.sh
source benchmarks/gpu_issue_and_tests.sh
VARIANTS=${VARIANTS-9,10,11,12,15,16}
AB=${AB-0,1,2,4,5,6,13}
timeout ${SMOKE_TIMEOUT:-150} python3 -m pytest -m gpu -q -x -p no:cacheprovider -n 4 tests/test_exp2_split_gpu.py \
  > "$OUT/smoke.log" 2>&1
rc=$?; tail -3 "$OUT/smoke.log"; echo "smoke: exit $rc after $(( $(date +%s) - s )) s"
[ $rc = 0 ] || exit 1
for i in ${VARIANTS//,/ }; do
  timeout 200 python3 benchmarks/bench_kernel_variants.py --extra --exp2-only --only "$i" --compile-only \
    > "/tmp/variants_compile_$i.log" 2>&1 &
done
for i in ${AB//,/ }; do
  timeout 200 python3 benchmarks/bench_against_revision.py --base ab_base/backends/triton --extra --no-forward \
    --only "$i" --rounds 0 > "/tmp/ab_compile_$i.log" 2>&1 &
done
wait
echo "compiled after $(( $(date +%s) - s )) s"; grep -l "Traceback" /tmp/variants_compile_*.log /tmp/ab_compile_*.log | xargs -r tail -5
if [ -n "$VARIANTS" ]; then
  timeout ${VARIANTS_TIMEOUT:-120} python3 benchmarks/bench_kernel_variants.py --extra --exp2-only --only "$VARIANTS" \
    --rounds 3 --json "$OUT/exp2_variants.json" > "$OUT/exp2_variants.log" 2>&1
  echo "variants: exit $? after $(( $(date +%s) - s )) s"; grep -v "^#" "$OUT/exp2_variants.log" | cut -c1-200 | tail -60
fi
if [ -n "$AB" ]; then
  timeout ${AB_TIMEOUT:-150} python3 benchmarks/bench_against_revision.py --base ab_base/backends/triton --extra \
    --no-forward --only "$AB" --rounds 3 --json "$OUT/against_revision.json" 2>&1 | tee "$OUT/against_revision.log"
  echo "A/B: after $(( $(date +%s) - s )) s"
fi
gpu_tests
