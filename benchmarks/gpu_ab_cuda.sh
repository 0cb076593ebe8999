#!/usr/bin/env bash
# A/B of the compiled cuda backend in one device call: the working tree's csrc/ against ab_base/csrc
# (a copy of another revision's csrc/, carried in). Builds the working tree, runs the smoke run and
# GPU tests of gpu_run_cuda.sh and bench_cuda.py, then rebuilds with ab_base/csrc and benchmarks it.
# Usage (GPU machine, repo root, nvidia-cutlass importable): bash benchmarks/gpu_ab_cuda.sh
# Knobs: those of gpu_run_cuda.sh, AB_BASES (the other trees' directories, default ab_base),
# AB_PROBLEMS (bench_cuda.py --only list), AB_BASE_PROBLEMS (the same for the other trees, default
# AB_PROBLEMS), SPLIT_PROBLEMS (also a per-kernel device-time split, kernel_split.py --backend
# cuda, of these problems on every tree; SPLIT_ARGS="--extra" adds its extra problems, 10-14),
# SASS=1 (the working tree's module disassembled into $OUT/new.sass.gz, to read its spills and waits).
# Leaves in $OUT: bench_<tree>.json, split_<tree>.json, device.txt and logs.tar.gz (every log).
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export HALOATTN_CUDA=on
# A warm machine keeps the last build: sources copied in with older times than its objects (the
# other tree's, say) would not be rebuilt. Touch them.
find csrc -type f -exec touch {} +
BENCH_PROBLEMS=${AB_PROBLEMS:-0,1,2,3,4,5,6,7,8,9} bash benchmarks/gpu_run_cuda.sh || exit 1
mv "$OUT/bench.json" "$OUT/bench_new.json"
split() {
  [ -n "$SPLIT_PROBLEMS" ] && timeout 120 python3 benchmarks/kernel_split.py --backend cuda --only "$SPLIT_PROBLEMS" --calls 10 $SPLIT_ARGS \
    --json "$OUT/split_$1.json" 2>&1 | tail -12
}
split new
if [ -n "$SASS" ]; then
  module=$(python3 -c "import haloattn_cuda._C as m; print(m.__file__)")
  cuobjdump -sass "$module" 2>&1 | gzip > "$OUT/new.sass.gz" || echo "cuobjdump failed"
fi
# Every other tree: ab_base/csrc, or each directory of AB_BASES (e.g. "ab_base ab_variant"), named
# by the directory's name without its "ab_" (files bench_<name>.json, split_<name>.json).
mv csrc csrc_new
for dir in ${AB_BASES:-ab_base}; do
  name=${dir#ab_}
  rm -rf csrc && cp -r "$dir/csrc" csrc
  find csrc -type f -exec touch {} +
  start=$(date +%s)
  python3 -m pip install --no-build-isolation --no-deps -e . > "$OUT/install_$name.log" 2>&1 || { tail -20 "$OUT/install_$name.log"; continue; }
  echo "$name install took $(( $(date +%s) - start )) s"
  timeout ${BENCH_TIMEOUT:-200} python3 benchmarks/bench_cuda.py --only ${AB_BASE_PROBLEMS:-${AB_PROBLEMS:-0,1,2,3,4,5,6,7,8,9}} --no-portable \
    --json "$OUT/bench_$name.json" 2>&1 | tail -12
  split "$name"
done
rm -rf csrc && mv csrc_new csrc
# The restored files keep their old times: touch them, or the next build reuses the other trees' objects.
find csrc -type f -exec touch {} +
# The device tool brings back only a few files from $OUT: keep the JSON results and device.txt
# loose, and the logs (install, smoke, tests, bench, info) in one archive. The tests' verdict is
# also printed, since a summary cut from the call's output tail is otherwise lost.
[ -f "$OUT/tests.log" ] && echo "tests: $(tail -1 "$OUT/tests.log")"
logs=$(cd "$OUT" && ls -- *.log info.txt 2>/dev/null)
if [ -n "$logs" ]; then
  (cd "$OUT" && tar -czf logs.tar.gz $logs && rm -f $logs)
fi
