#!/usr/bin/env bash
# One device call (2026-12-05): the last two kq_conv GPU tests, then the backward ceiling of
# bench_triton_ceiling.py at D=128 and D=64 (files under $OUT).
#   bash benchmarks/gpu_run_backward_ceiling.sh
source benchmarks/gpu_preamble.sh
timeout -s INT 200 python3 -m pytest -m gpu -q -p no:cacheprovider -rA --tb=short tests/test_triton_kq_conv_gpu.py -k "repeatable or wide_float32" > $OUT/kq_conv_tests.log 2>&1; echo "kq tests $? $(( $(date +%s) - s ))s"; tail -5 $OUT/kq_conv_tests.log
timeout -s INT 220 python3 benchmarks/bench_triton_ceiling.py --backward --json $OUT/ceiling_bwd_d128.json > $OUT/ceiling_bwd_d128.log 2>&1; echo "d128 $? $(( $(date +%s) - s ))s"; tail -20 $OUT/ceiling_bwd_d128.log
timeout -s INT 180 python3 benchmarks/bench_triton_ceiling.py --backward --head-dim 64 --json $OUT/ceiling_bwd_d64.json > $OUT/ceiling_bwd_d64.log 2>&1; echo "d64 $? $(( $(date +%s) - s ))s"; tail -20 $OUT/ceiling_bwd_d64.log
