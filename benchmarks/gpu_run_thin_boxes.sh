#!/usr/bin/env bash
# One device call for window-relative thinness (tiles.THIN_RELATIVE_TO_WINDOW): the package with
# it on against this tree (off) side by side, forward and backward, on the problems whose boxes
# it moves: the 3-D issue row (its Gluon forward's boxes), the 3-D 3x7x7 extra (its Triton
# boxes at D=64) and the anisotropic extras 3x63, 3x3x31, 15x127 causal (every kernel's boxes).
# "base" is the flag on: base / this below 1 means the flag on is faster.
# Make the package with the flag on first (ab_thin/ is in .git/info/exclude; carry it):
#   mkdir -p ab_thin && git archive HEAD backends/triton | tar -x -C ab_thin
#   sed -i 's/^THIN_RELATIVE_TO_WINDOW = False/THIN_RELATIVE_TO_WINDOW = True/' ab_thin/backends/triton/tiles.py
# Usage (GPU machine, repo root): bash benchmarks/gpu_run_thin_boxes.sh
# Knobs: THIN_PROBLEMS (default 5,12,20,21,22), AB_TIMEOUT (seconds).
source benchmarks/gpu_preamble.sh
grep -q "^THIN_RELATIVE_TO_WINDOW = True" ab_thin/backends/triton/tiles.py || { echo "ab_thin/ has the flag off"; exit 1; }
timeout ${AB_TIMEOUT:-300} python3 benchmarks/bench_against_revision.py --base ab_thin/backends/triton --extra \
  --only ${THIN_PROBLEMS:-5,12,20,21,22} --rounds 3 --json "$OUT/thin_against_this.json" 2>&1 | tee "$OUT/thin_against_this.log"
echo "thinness A/B: after $(( $(date +%s) - s )) s"
