"""benchmarks/bench_triton_ceiling.py's own kernels (the plain dense flash forward with its LSE and
the two-kernel backward that RESULTS.md measures Triton's ceiling with) against float64 autograd,
through the script's --interpret-check in Triton's CPU interpreter: a wrong yardstick would
mislead every bound drawn from it."""

import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks", "bench_triton_ceiling.py")


def test_plain_kernels_match_float64():
    env = dict(os.environ, TRITON_INTERPRET="1")
    result = subprocess.run([sys.executable, SCRIPT, "--interpret-check"], env=env, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = [line for line in result.stdout.splitlines() if line.startswith("B=")]
    assert len(lines) == 2 and all("dq" in line and "dv" in line for line in lines), result.stdout
