"""The Gluon kernels still build for sm_90: the triton backend's Gluon forward, dQ and dK/dV passes
on every rank, pattern and feature their launch plans take (benchmarks/compile_report_gluon_forward.py,
compile_report_gluon_dq.py, compile_report_gluon_dkdv.py), and the dense probe RESULTS.md measures ("Gluon probes";
benchmarks/gluon_forward_probe.py --compile-only). Gluon has no CPU interpreter, so CI builds them
(in a child process without TRITON_INTERPRET) and checks what ptxas made of each: no spills (but
the dK/dV pass's few scalars), shared memory within an H100's 227 KiB a block, the wgmma and TMA
instructions the structure relies on, and the register split (setmaxnreg) that lets the producer
warp give its registers away."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("triton.experimental.gluon")

BENCHMARKS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks")
SHARED_LIMIT = 227 * 1024  # an sm_90 block's dynamic shared memory


def _compile(script: str, *args: str) -> list:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, os.path.join(BENCHMARKS, script), *args], env=env,
                            capture_output=True, text=True, timeout=1200)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return [json.loads(line[len("RESULT "):]) for line in result.stdout.splitlines() if line.startswith("RESULT ")]


# The split walk's consumers (gluon_split_walk.py) keep the stream's counts through the exclusive
# phase: ptxas spills one scalar of them on most walks (4 B at 240 registers a thread; giving the
# consumers more starves the producer warp, which then spills its own bookkeeping).
SPLIT_WALK_SPILL_LIMIT = 8
# The whole walk's programs walk several boxes (a persistent grid): LLVM hoists the kernel's
# box-invariant scalars (lengths less one, the grid's step) out of every loop, and ptxas spills a
# few of them, reloaded once a box, outside the loop over its key tiles.
WHOLE_WALK_SPILL_LIMIT = 64


@pytest.mark.parametrize("script,args,count", [("gluon_forward_probe.py", ("--compile-only",), 12),
                                               ("compile_report_gluon_forward.py", (), 9),
                                               ("compile_report_gluon_forward.py", ("--tiling", "split128"), 10),
                                               ("compile_report_gluon_forward.py", ("--tiling", "split64"), 10)])
def test_gluon_kernels_build_for_sm90(script, args, count):
    rows = _compile(script, *args)
    assert len(rows) == count, [row["label"] for row in rows]
    for row in rows:
        limit = 0 if script == "gluon_forward_probe.py" else (
            SPLIT_WALK_SPILL_LIMIT if "split walk" in row["label"] else WHOLE_WALK_SPILL_LIMIT)
        assert row["spill_bytes"] <= limit, row
        assert row["shared"] <= SHARED_LIMIT, row
        assert row["ops"].get("HGMMA", 0) >= 16 and row["ops"].get("UTMALDG", 0) >= 3, row
        # one consumer: 128 a thread over 8 warps (two programs a multiprocessor); two: the rest
        assert row["regs"] in (128, 168), row


# At 128 channels the dK/dV consumers hold two 64 x 128 float32 accumulators, S^T, dP^T and both
# register operands: ptxas spills a few scalars of the walk (reloaded once a step from L1), never
# a tile (one accumulator row alone would be 256 bytes a thread).
DKDV_SPILL_LIMIT = {64: 0, 128: 320}


def test_gluon_dkdv_builds_for_sm90():
    rows = _compile("compile_report_gluon_dkdv.py")
    assert len(rows) == 18, [row["label"] for row in rows]
    for row in rows:
        width = 64 if "D=64" in row["label"] else 128
        assert row["spill_bytes"] <= DKDV_SPILL_LIMIT[width], row
        assert row["shared"] <= SHARED_LIMIT, row
        # 8 + 8 (S^T, dP^T) and 4 + 4 (dV, dK) wgmma a step at 128 channels, half the depth at 64
        assert row["ops"].get("HGMMA", 0) >= 24 and row["ops"].get("UTMALDG", 0) >= 5, row
        assert row["regs"] == 168, row


# The dQ consumers hold dQ (64 x D float32) and a 64-key tile's S, dP and dS: no spills (on
# 128-key tiles at 128 channels ptxas serialised every wgmma, C7512).
DQ_SPILL_LIMIT = {64: 0, 128: 0}


def test_gluon_dq_builds_for_sm90():
    rows = _compile("compile_report_gluon_dq.py")
    assert len(rows) == 18, [row["label"] for row in rows]
    for row in rows:
        width = 64 if "D=64" in row["label"] else 128
        assert row["spill_bytes"] <= DQ_SPILL_LIMIT[width], row
        assert row["shared"] <= SHARED_LIMIT, row
        # S and dP: D / 16 wgmma each a tile, dQ a key tile's depth / 16, in two copies of the step
        assert row["ops"].get("HGMMA", 0) >= (80 if width == 128 else 48), row
        assert row["ops"].get("UTMALDG", 0) >= 6, row
        assert row["regs"] == 168, row
