#!/usr/bin/env bash
# One GPU session for the short-window work (issue 4): install, GPU tests, benchmarks; logs in $OUT.
#   bash benchmarks/gpu_run_window.sh [all|tests|bench|sweep]     (OUT defaults to /tmp/haloattn_out)
# sweep: only the launch-config sweep of the window kernels (bench_window.py --sweep, about 1-2 min).
# TEST_TIMEOUT (s, default 180): the GPU tests run serially, about 60 s on an H100. Not under
# xdist: eight workers each running the float64 oracle's backward on all 16 cores slowed every test
# past 100 s (H100, 2026-11-23), which looked like hangs.
set -o pipefail
export PYTHONUNBUFFERED=1 HALOATTN_CUDA=off
MODE=${1:-all}
OUT=${OUT:-/tmp/haloattn_out}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."

if ! python3 -m pip install --no-build-isolation --no-deps -e . -q 2>&1 | tee "$OUT/install.log"; then
  # Fallback: lay the package out by hand, with the entry points the plugins register through.
  site=/tmp/haloattn_site
  rm -rf "$site" && mkdir -p "$site/haloattn-0.1.0.dist-info"
  cp -r core/haloattn "$site/haloattn"
  cp -r backends/reference backends/triton "$site/haloattn/backends/"
  printf 'Metadata-Version: 2.1\nName: haloattn\nVersion: 0.1.0\n' > "$site/haloattn-0.1.0.dist-info/METADATA"
  sed -n '/entry-points."haloattn.backends"/,/^$/p' pyproject.toml \
    | sed 's/\[project.entry-points."haloattn.backends"\]/[haloattn.backends]/' \
    > "$site/haloattn-0.1.0.dist-info/entry_points.txt"
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
  echo "pip install failed; using $site" | tee -a "$OUT/install.log"
fi
nvidia-smi --query-gpu=name,driver_version --format=csv | tee "$OUT/device.txt"
git rev-parse --short HEAD 2>/dev/null | tee -a "$OUT/device.txt"; date -u | tee -a "$OUT/device.txt"
python3 -c "import torch, triton, timm; print('torch', torch.__version__, 'triton', triton.__version__, 'timm', timm.__version__)" | tee -a "$OUT/device.txt"

if [ "$MODE" = sweep ]; then
  timeout 240 python3 benchmarks/bench_window.py --sweep --markdown "$OUT/sweep_window.md" --json "$OUT/sweep_window.json" \
    2>&1 | tee "$OUT/sweep_window.log"
  exit
fi
if [ "$MODE" != bench ]; then
  # pytest-timeout names a test that hangs; -rA lists every outcome in the summary.
  timeout "${TEST_TIMEOUT:-180}" python3 -m pytest -p no:xdist -m "gpu or not gpu" -q -rA --timeout 120 --tb=short \
    -p no:cacheprovider tests/test_window_gpu.py tests/test_timm.py 2>&1 | tee "$OUT/tests.log"
fi
if [ "$MODE" != tests ]; then
  # SDPA in every mask layout and forced backend: about 140 timings, 1-1.5 min on an H100.
  timeout 200 python3 benchmarks/bench_window.py --markdown "$OUT/bench_window.md" --json "$OUT/bench_window.json" 2>&1 \
    | tee "$OUT/bench_window.log"
  timeout 90 python3 benchmarks/bench_swin_timm.py --batch 128 --fused --markdown "$OUT/bench_timm.md" 2>&1 \
    | tee "$OUT/bench_timm.log"
fi
