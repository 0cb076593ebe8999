#!/usr/bin/env bash
# One device call for a session's closing measurements of both Triton backends: window GPU tests
# and timm parity, the window benchmark (SDPA in every mask layout) and its launch-config sweep,
# timm Swin-T throughput, the neighbourhood benchmark without Flex (triton and cuDNN, all ten
# problems), and host-vs-device time per call. Eight files come back under $OUT.
#   bash benchmarks/gpu_run_session.sh
set -o pipefail
export PYTHONUNBUFFERED=1 HALOATTN_CUDA=off
OUT=${OUT:-/tmp/out}
WORK=/tmp/session_logs
mkdir -p "$OUT" "$WORK"
began=$(date +%s)
stamp() { echo "[$(( $(date +%s) - began )) s] $*"; }
OUT=$WORK bash benchmarks/gpu_run_window.sh tests > /dev/null 2>&1
stamp "window tests"; tail -4 "$WORK/tests.log"
cp "$WORK/tests.log" "$OUT/window_tests.log"; cp "$WORK/device.txt" "$OUT/device.txt"
timeout 200 python3 benchmarks/bench_window.py --markdown "$OUT/bench_window.md" --json "$WORK/bench_window.json" \
  > "$WORK/bench_window.log" 2>&1
stamp "window bench"; tail -30 "$WORK/bench_window.log"
timeout 150 python3 benchmarks/bench_window.py --sweep --markdown "$OUT/sweep_window.md" --json "$WORK/sweep.json" \
  > "$WORK/sweep.log" 2>&1
stamp "window sweep"; grep -A12 -i "summary" "$OUT/sweep_window.md" | head -20
timeout 90 python3 benchmarks/bench_swin_timm.py --batch 128 --fused --markdown "$OUT/bench_timm.md" > "$WORK/timm.log" 2>&1
stamp "timm"; cat "$OUT/bench_timm.md"
timeout 120 python3 benchmarks/bench_neighborhood.py --no-flex --markdown "$OUT/neighborhood.md" --json "$WORK/nb.json" \
  > "$WORK/nb.log" 2>&1
stamp "neighbourhood"; cat "$OUT/neighborhood.md"
timeout 60 python3 benchmarks/bench_launch_overhead.py > "$OUT/launch_overhead.md" 2>&1
stamp "launch overhead"; cat "$OUT/launch_overhead.md"
