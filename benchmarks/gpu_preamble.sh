# Sourced by the one-call GPU scripts (gpu_run_checks.sh, gpu_run_float32.sh,
# gpu_run_head_split.sh): $OUT made, the device and tree recorded in $OUT/device.txt, haloattn
# installed without the cuda module (Triton backends only; with WITH_CUDA=1 the cuda module is
# built too, for HALOATTN_CUDA_ARCHS (default 90a), from the nvidia-cutlass wheel carried in
# .whl/), and the clock `s` started.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; git rev-parse --short HEAD; git status --short | head; date -u; } > $OUT/device.txt
cuda=off
if [ -n "$WITH_CUDA" ]; then
  command -v nvcc > /dev/null || export PATH=/usr/local/cuda/bin:$PATH
  python3 -m pip install -q --no-deps --no-index .whl/nvidia_cutlass-*.whl > $OUT/install.log 2>&1 || { tail -20 $OUT/install.log; exit 1; }
  cuda=on
fi
HALOATTN_CUDA=$cuda python3 -m pip install --no-build-isolation --no-deps -e . -q >> $OUT/install.log 2>&1 || { tail -20 $OUT/install.log; exit 1; }
s=$(date +%s)
