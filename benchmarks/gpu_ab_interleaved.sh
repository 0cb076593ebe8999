#!/usr/bin/env bash
# Interleaved A/B of the compiled cuda backend: device times of several csrc/ trees measured in
# alternating rounds, so that a drift of the shared machine (clocks, a neighbour) falls on every
# tree alike instead of on whichever ran last. gpu_ab_cuda.sh times each tree once, one after the
# other; differences of a few per cent between its trees were often within that drift.
#
# Each tree (the working tree's csrc/ as "new", then every directory of AB_BASES holding a csrc/,
# named without its "ab_"; AB_BASES=none times the working tree alone, against TRITON's times,
# when the device time left allows one build only) is built once into a wheel and installed into a
# directory of its own;
# then ROUNDS rounds run kernel_split.py on every tree in turn, each tree through PYTHONPATH.
# ab_interleaved_summary.py prints each problem's median forward and backward time per tree and
# the ratios to the first tree.
# Usage (GPU machine, repo root, nvidia-cutlass importable):
#   AB_BASES="ab_main" SPLIT_PROBLEMS=0,9 [SPLIT_ARGS=--extra] [ROUNDS=3] [TESTS=tests/test_cuda_gpu.py] \
#   [BENCH_PROBLEMS=5,6 (bench_cuda.py's do_bench times too, each round)] [TRITON=1 (triton's too)] \
#   bash benchmarks/gpu_ab_interleaved.sh
# Leaves in $OUT: summary.txt, device.txt, splits.tar.gz (split_<tree>_<round>.json) and logs.tar.gz
# (the device tool brings back only a few files).
set -o pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export HALOATTN_CUDA=on PYTHONUNBUFFERED=1
command -v nvcc > /dev/null || export PATH=/usr/local/cuda/bin:$PATH
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/device.txt"
git rev-parse --short HEAD 2>/dev/null | tee -a "$OUT/device.txt"
date -u | tee -a "$OUT/device.txt"
SITES=${SITES:-/tmp/haloattn_ab_sites}
rm -rf "$SITES" && mkdir -p "$SITES"

build() {  # $1: tree name; builds the current csrc/ into $SITES/$1
  find csrc -type f -exec touch {} +
  local start=$(date +%s)
  python3 -m pip wheel --no-build-isolation --no-deps . -w "$SITES/wheel_$1" > "$OUT/build_$1.log" 2>&1 || {
    tail -20 "$OUT/build_$1.log"; return 1; }
  python3 -m pip install -q --no-deps --target "$SITES/$1" "$SITES/wheel_$1"/haloattn-*.whl >> "$OUT/build_$1.log" 2>&1 || return 1
  echo "$1 built in $(( $(date +%s) - start )) s"
}

for dir in ${AB_BASES:-ab_base}; do  # before any build: a misnamed tree costs no device time
  [ "$dir" = none ] || [ -d "$dir/csrc" ] || {
    echo "AB_BASES: $dir has no csrc/ (untracked directories travel to the GPU machine, ignored ones do not)"; exit 1; }
done
trees="new"
build new || exit 1
mv csrc csrc_new
for dir in ${AB_BASES:-ab_base}; do
  [ "$dir" = none ] && continue
  name=${dir#ab_}
  rm -rf csrc && cp -r "$dir/csrc" csrc
  build "$name" && trees="$trees $name"
done
rm -rf csrc && mv csrc_new csrc
find csrc -type f -exec touch {} +
# An editable install would shadow the trees' packages: none may be importable besides them.
python3 -m pip uninstall -y -q haloattn > /dev/null 2>&1
# The working tree's kernels first run a few calls under a short timeout (a hung kernel would
# otherwise cost every round's timeout).
if ! PYTHONPATH="$SITES/new" timeout ${SMOKE_TIMEOUT:-90} python3 benchmarks/cuda_smoke.py > "$OUT/smoke.log" 2>&1; then
  tail -20 "$OUT/smoke.log"; echo "smoke run failed or timed out"; exit 1
fi

for round in $(seq 1 ${ROUNDS:-3}); do
  for name in $trees; do
    echo "round $round: $name"
    PYTHONPATH="$SITES/$name" timeout ${SPLIT_TIMEOUT:-120} python3 benchmarks/kernel_split.py --backend cuda \
      --only "${SPLIT_PROBLEMS:-0,9}" --calls ${CALLS:-20} $SPLIT_ARGS --json "$OUT/split_${name}_$round.json" > "$OUT/split_${name}_$round.log" 2>&1 \
      || tail -5 "$OUT/split_${name}_$round.log"
    # BENCH_PROBLEMS: also bench_cuda.py's do_bench times (host included, L2 flushed between calls).
    if [ -n "$BENCH_PROBLEMS" ]; then
      PYTHONPATH="$SITES/$name" timeout ${BENCH_TIMEOUT:-120} python3 benchmarks/bench_cuda.py --only "$BENCH_PROBLEMS" \
        --no-portable --json "$OUT/bench_${name}_$round.json" > "$OUT/bench_${name}_$round.log" 2>&1 \
        || tail -5 "$OUT/bench_${name}_$round.log"
    fi
  done
  # TRITON=1: the triton backend's device times too, in the same rounds (its kernels are the
  # working tree's), summarised as one more tree, "triton": the yardstick the cuda trees chase.
  if [ -n "$TRITON" ]; then
    PYTHONPATH="$SITES/new" timeout ${SPLIT_TIMEOUT:-120} python3 benchmarks/kernel_split.py --backend triton \
      --only "${SPLIT_PROBLEMS:-0,9}" --calls ${CALLS:-20} $SPLIT_ARGS --json "$OUT/split_triton_$round.json" > "$OUT/split_triton_$round.log" 2>&1 \
      || tail -5 "$OUT/split_triton_$round.log"
  fi
done
python3 benchmarks/ab_interleaved_summary.py "$OUT" $trees ${TRITON:+triton} | tee "$OUT/summary.txt"
# TESTS (a pytest selection): the GPU tests on the working tree's build, after the timings.
if [ -n "$TESTS" ]; then
  PYTHONPATH="$SITES/new" timeout ${TEST_TIMEOUT:-150} python3 -m pytest -m gpu -q -n 8 -p no:cacheprovider --timeout 100 \
    --tb=short -rf $TESTS > "$OUT/tests.log" 2>&1
  echo "tests: $(tail -1 "$OUT/tests.log")"
  grep -E "^(FAILED|ERROR)" "$OUT/tests.log" | head -20
fi
(cd "$OUT" && tar -czf logs.tar.gz *.log && rm -f *.log && tar -czf splits.tar.gz split_*.json bench_*.json 2>/dev/null; rm -f split_*.json bench_*.json)
