#!/usr/bin/env bash
# One device call for window-relative thinness (tiles.THIN_RELATIVE_TO_WINDOW, the default since
# 2026-12-07 for the Triton kernels' boxes): the package with it off (the token rule) against this
# tree side by side, forward and backward, on the problems whose boxes it moves: the 3-D 3x7x7
# extra (its Triton boxes at D=64) and the anisotropic extras 3x63, 3x3x31, 15x127 causal, and
# the 3-D issue row as a check (its boxes stay). base / this above 1: the window rule is faster.
# Make the package with the flag off first (ab_thin/ is in .git/info/exclude; carry it):
#   mkdir -p ab_thin && git archive HEAD backends/triton | tar -x -C ab_thin
#   sed -i 's/^THIN_RELATIVE_TO_WINDOW = True/THIN_RELATIVE_TO_WINDOW = False/' ab_thin/backends/triton/tiles.py
# Usage (GPU machine, repo root): bash benchmarks/gpu_run_thin_boxes.sh
# Knobs: THIN_PROBLEMS (default 20,21,22,12,5), AB_TIMEOUT (seconds).
source benchmarks/gpu_preamble.sh
grep -q "^THIN_RELATIVE_TO_WINDOW = False" ab_thin/backends/triton/tiles.py || { echo "ab_thin/ has the flag on"; exit 1; }
timeout ${AB_TIMEOUT:-300} python3 benchmarks/bench_against_revision.py --base ab_thin/backends/triton --extra \
  --only ${THIN_PROBLEMS:-20,21,22,12,5} --rounds 3 --json "$OUT/thin_against_this.json" 2>&1 | tee "$OUT/thin_against_this.log"
echo "thinness A/B: after $(( $(date +%s) - s )) s"
