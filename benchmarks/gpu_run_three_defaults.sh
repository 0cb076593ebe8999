#!/usr/bin/env bash
# One device call for three default changes of 2026-12-07 (tiles.py): the dilated rows regrouped
# onto the Gluon forward (GLUON_REGROUP_DILATED), window-relative thinness of the Triton kernels'
# boxes (THIN_RELATIVE_TO_WINDOW) and the Gluon forward at 64 channels (GLUON_HEAD_DIM_RATE).
# This tree against the package before them side by side (bench_against_revision.py), forward and
# backward: the dilation-2 issue row, the 3-D issue row (unchanged: a check), the 3-D 3x7x7,
# 1-D 2047 and 63x63 extras at D=64, and the anisotropic extras 3x63, 3x3x31, 15x127 causal; then
# the issue benchmark (triton and dense cuDNN, no Flex).
# Make the package before first (ab_base/ is in .git/info/exclude; carry it):
#   git archive 8da445d backends/triton | tar -x -C ab_base
# Usage (GPU machine, repo root): bash benchmarks/gpu_run_three_defaults.sh
# Knobs: AB_PROBLEMS, AB_TIMEOUT, ISSUE_TIMEOUT (seconds).
source benchmarks/gpu_preamble.sh
timeout ${AB_TIMEOUT:-240} python3 benchmarks/bench_against_revision.py --base ab_base/backends/triton --extra \
  --only ${AB_PROBLEMS:-3,5,12,15,16,20,21,22} --rounds 3 --json "$OUT/against_revision.json" 2>&1 | tee "$OUT/against_revision.log"
echo "A/B: after $(( $(date +%s) - s )) s"
timeout ${ISSUE_TIMEOUT:-240} python3 benchmarks/bench_neighborhood.py --no-flex --only 0,1,2,3,4,5,6,7,8,9 \
  --json "$OUT/issue.json" --markdown "$OUT/issue.md" > "$OUT/issue.log" 2>&1
echo "issue benchmark: exit $? after $(( $(date +%s) - s )) s"; grep "^|" "$OUT/issue.log" | head -24
