#!/usr/bin/env bash
# One device call for boxes one token deep on window-1 axes (tiles._shapes): the Gluon forward's
# GPU tests of axial windows and regrouped dilated problems on every tiling (smoke: exit on
# failure), then the Gluon forward's tilings against the Triton forward on the dilated and
# window-1 problems (bench_gluon_split_walk.py: decides tiles.GLUON_REGROUP_DILATED), then this
# tree's default configs against the package before the change side by side, forward and backward
# (bench_against_revision.py: the dilation-2 issue row, axial 1x63, per-frame 1x15x15, axial 31x1
# causal at 64 channels), then, where ab_thin/ was carried, window-relative thinness
# (gpu_run_thin_boxes.sh's A/B). The decision first: a call cut short keeps it.
# Make the package before the change first (ab_base/ is in .git/info/exclude; carry it):
#   git archive 3e640ca backends/triton | tar -x -C ab_base
# Usage (GPU machine, repo root): bash benchmarks/gpu_run_window_one_boxes.sh
# Knobs: SMOKE_TIMEOUT, TILINGS_TIMEOUT, AB_TIMEOUT, THIN_TIMEOUT (seconds), THIN_PROBLEMS.
source benchmarks/gpu_preamble.sh
timeout ${SMOKE_TIMEOUT:-150} python3 -m pytest -m gpu -q -x -p no:cacheprovider -n 4 \
  tests/test_gluon_forward_gpu.py -k "window_one or regrouped" > "$OUT/smoke.log" 2>&1
rc=$?; tail -3 "$OUT/smoke.log"; echo "smoke: exit $rc after $(( $(date +%s) - s )) s"
[ $rc = 0 ] || exit 1
timeout ${TILINGS_TIMEOUT:-120} python3 benchmarks/bench_gluon_split_walk.py --only 4,13,14 \
  --tilings whole,split128x3,split64 --json "$OUT/gluon_tilings.json" 2>&1 | tee "$OUT/gluon_tilings.log"
echo "tilings: after $(( $(date +%s) - s )) s"
timeout ${AB_TIMEOUT:-150} python3 benchmarks/bench_against_revision.py --base ab_base/backends/triton --extra \
  --only 3,17,18,19 --rounds 3 --json "$OUT/against_revision.json" 2>&1 | tee "$OUT/against_revision.log"
echo "A/B: after $(( $(date +%s) - s )) s"
# Then window-relative thinness, where ab_thin/ was carried (as of 2026-12-07 23:04: ab_thin/
# with the flag on for every kernel's boxes against this tree's token rule; since 938b898 the
# flag is on and gpu_run_thin_boxes.sh runs that comparison the other way round)
if [ -d ab_thin ]; then
  timeout ${THIN_TIMEOUT:-150} python3 benchmarks/bench_against_revision.py --base ab_thin/backends/triton --extra \
    --only ${THIN_PROBLEMS:-5,20,21,12,22} --rounds 3 --json "$OUT/thin_against_this.json" 2>&1 | tee "$OUT/thin_against_this.log"
  echo "thinness A/B: after $(( $(date +%s) - s )) s"
fi
