#!/usr/bin/env bash
# One device call: both issues' benchmarks (gpu_run_issue_benchmarks.sh, no tests), then the mods
# compiled into backend triton (gpu_run_mods.sh: their GPU tests and bench_flex_mods.py). Files
# under $OUT: those of both scripts.
#   bash benchmarks/gpu_run_issue_and_mods.sh      (the nvidia-cutlass wheel carried in .whl/)
TESTS="" bash "$(dirname "$0")/gpu_run_issue_benchmarks.sh"
bash "$(dirname "$0")/gpu_run_mods.sh"
