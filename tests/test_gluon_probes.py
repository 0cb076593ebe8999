"""The Gluon probes RESULTS.md measures ("Gluon probes") still build for sm_90: Gluon has no CPU
interpreter, so CI compiles each probe's every variant (benchmarks/gluon_*_probe.py --compile-only,
in a child process without TRITON_INTERPRET) and checks what ptxas made of it: no spills, shared
memory within an H100's 227 KiB a block, the wgmma and TMA instructions the structure relies on,
and the register split (setmaxnreg) that lets the producer warp give its registers away."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("triton.experimental.gluon")

BENCHMARKS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks")
SHARED_LIMIT = 227 * 1024  # an sm_90 block's dynamic shared memory


def _compile(script: str) -> list:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, os.path.join(BENCHMARKS, script), "--compile-only"], env=env,
                            capture_output=True, text=True, timeout=1200)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return [json.loads(line[len("RESULT "):]) for line in result.stdout.splitlines() if line.startswith("RESULT ")]


@pytest.mark.parametrize("script,count", [("gluon_forward_probe.py", 12), ("gluon_neighborhood_probe.py", 32)])
def test_probe_variants_build_for_sm90(script, count):
    rows = _compile(script)
    assert len(rows) == count, [row["label"] for row in rows]
    for row in rows:
        assert row["spill_bytes"] == 0, row
        assert row["shared"] <= SHARED_LIMIT, row
        assert row["ops"].get("HGMMA", 0) >= 16 and row["ops"].get("UTMALDG", 0) >= 3, row
        # one consumer: 128 a thread over 8 warps (two programs a multiprocessor); two: the rest
        assert row["regs"] in (128, 168), row
