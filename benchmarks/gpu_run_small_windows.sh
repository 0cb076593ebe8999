#!/usr/bin/env bash
# One device call: bench_small_query_tiles.py --small-windows (16- and 32-query tiles on small
# windows at head dims 64-256), its kernels compiled first in one process per problem, into $OUT.
# Usage (GPU machine, repo root): bash benchmarks/gpu_run_small_windows.sh   Knobs: ONLY (indices).
source "$(dirname "$0")/gpu_preamble.sh"
stamp() { echo "$1 exit $2 at $(( $(date +%s) - s )) s, $(date -u +%H:%M:%S)" >> $OUT/device.txt; }
indices=${ONLY:-0,1,2,3,4,5,6,7}
for i in ${indices//,/ }; do
  timeout 240 python3 benchmarks/bench_small_query_tiles.py --small-windows --only $i --compile-only > $OUT/compile_$i.log 2>&1 &
done
wait; stamp compile 0
cat $OUT/compile_*.log | grep -i "error\|Traceback" | head -5; cat $OUT/compile_*.log > $OUT/compile.log; rm -f $OUT/compile_*.log
timeout 300 python3 benchmarks/bench_small_query_tiles.py --small-windows --only $indices --json $OUT/small_windows.json \
  --markdown $OUT/small_windows.md > $OUT/small_windows.log 2>&1
stamp bench $?
cat $OUT/small_windows.md; tail -3 $OUT/small_windows.log; cat $OUT/device.txt
