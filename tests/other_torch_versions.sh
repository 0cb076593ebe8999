#!/usr/bin/env bash
# The CPU tests of the core and the reference and flex backends under other torch releases than
# the suite's own (torch 2.13.0): pyproject.toml promises torch >= 2.5, and the GPU machines run
# torch 2.11, whose torch.compile traced less than 2.13's (a fullgraph compile failed there and
# passed here, 2026-11-29). Each version gets its own virtual environment (.venv-torch-VERSION,
# several GB: PyPI's torch wheels bring CUDA libraries) with the Triton that torch pins, haloattn
# installed from this tree (editable, its own build folder) without the cuda module. The Triton
# interpreter's tests stay with the main suite: they need Triton >= 3.6, which older torch
# releases do not pin.
#   bash tests/other_torch_versions.sh [VERSION ...]       (default: 2.5.1 2.6.0 2.11.0)
# Prints one line per version and exits non-zero if any failed; logs in .venv-torch-VERSION/tests.log.
set -uo pipefail
cd "$(dirname "$0")/.."
versions=("$@")
[ ${#versions[@]} -gt 0 ] || versions=(2.5.1 2.6.0 2.11.0)
core_tests=()
for name in compile autocast dispatch nn tracing dtensor flex_backend validation second_order gradcheck tuning \
            memory geometry flop_count reference_oracle reference_speed_paths memory_watchdog device_constants; do
  core_tests+=(tests/test_$name.py)
done
status=0
for version in "${versions[@]}"; do
  venv=.venv-torch-$version
  if [ ! -e $venv/.installed ]; then
    rm -rf $venv && python3 -m venv $venv
    if ! { $venv/bin/python -m pip install -q "torch==$version" "setuptools>=70.1" &&
           HALOATTN_CUDA=off SKBUILD_BUILD_DIR=build/$venv $venv/bin/python -m pip install -q -e '.[test]'; } \
         > $venv/install.log 2>&1; then
      echo "torch $version: install failed"; grep -v WARNING $venv/install.log | tail -5; status=1; continue
    fi
    touch $venv/.installed
  fi
  $venv/bin/python -m pytest -q -p no:cacheprovider -rs "${core_tests[@]}" > $venv/tests.log 2>&1
  code=$?
  echo "torch $version: $(tail -n 1 $venv/tests.log)"
  [ $code -eq 0 ] || status=1
done
exit $status
