"""The forward's exp2s split between the multi-function unit and the FMA pipe (exp2_split.py):
the polynomial's arithmetic against float64, the PTX's constants, the config rule, and the forward
built for sm_90 with fewer MUFU.EX2 (no GPU: the interpreter has no inline PTX, so the CPU tests'
forwards keep every exp2 exact; tests/test_exp2_split_gpu.py runs the PTX)."""

from __future__ import annotations

import json
import math
import os
import re
import struct
import subprocess
import sys

import pytest
import torch

from haloattn.backend import AttentionInputs
from haloattn.backends.triton import exp2_split, launch, tiles
from haloattn.problem import build_problem

BENCHMARKS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")


def _polynomial_lanes(x: torch.Tensor, every: int) -> torch.Tensor:
    """Where exp2_split_reference takes the polynomial (the last of each run of ``every``)."""
    return torch.arange(x.shape[-1]) % every == every - 1


@pytest.mark.parametrize("every", [2, 4])
def test_polynomial_lanes_within_their_bound_of_float64(every):
    gen = torch.Generator().manual_seed(every)
    # every magnitude the softmax meets: far below a row's maximum up to the lazy rescale's slack
    x = torch.cat([torch.rand(64, 4096, generator=gen) * 134 - 126, torch.randn(64, 4096, generator=gen)])
    got = exp2_split.exp2_split_reference(x, every).double()
    exact = torch.exp2(x.double())
    relative = ((got - exact).abs() / exact)
    lanes = _polynomial_lanes(x, every).expand_as(x)
    # float32 rounding of the Horner steps adds a few ulp to the polynomial's own error
    assert relative[lanes].max().item() <= exp2_split.MAX_RELATIVE_ERROR + 4 * 2.0**-24
    assert relative[lanes].max().item() > 1e-6  # (the polynomial's lanes are not exp2's)
    assert relative[~lanes].max().item() <= 2.0**-22


@pytest.mark.parametrize("every", [2, 4])
def test_polynomial_is_exact_where_the_softmax_needs_it(every):
    # a row's maximum gives exactly 1; masked scores (-inf) and the clamp give exactly +0
    x = torch.tensor([0.0, -float("inf"), -127.0, -500.0]).repeat_interleave(every).reshape(4, every)
    got = exp2_split.exp2_split_reference(x, every)[:, -1]
    assert got.tolist() == [1.0, 0.0, 0.0, 0.0]
    assert not torch.signbit(got[1:]).any()
    # between the clamp and float32's normal range: tiny, non-negative, never above 2^-126
    tiny = exp2_split.exp2_split_reference(torch.linspace(-127, -126, 4 * every).reshape(4, every), every)[:, -1]
    assert (tiny >= 0).all() and (tiny <= 2.0**-126).all()


def _ptx_constants(ptx: str) -> list:
    return [struct.unpack(">f", bytes.fromhex(h))[0] for h in re.findall(r"0f([0-9A-F]{8})", ptx)]


@pytest.mark.parametrize("every", [2, 4])
def test_ptx_carries_the_reference_constants(every):
    ptx = exp2_split.split_ptx(every)
    assert ptx.count("ex2.approx.ftz.f32") == every - 1
    f32 = [struct.unpack("f", struct.pack("f", c))[0] for c in (exp2_split.FLOOR, exp2_split.ROUNDER,
                                                                 exp2_split.C3, exp2_split.C2, exp2_split.C1, 1.0)]
    # (the rounder is added, then subtracted: sub.rn with the same constant)
    assert _ptx_constants(ptx) == [f32[0], f32[1], f32[1], f32[2], f32[3], f32[4], f32[5]]
    # the polynomial writes the run's last output from its last input
    assert f"add.s32 ${every - 1}, r, e;" in ptx and f"max.ftz.f32 x, ${2 * every - 1}," in ptx


def _problem(dtype, head_dim, value_dim=None):
    q = torch.empty(1, 20, 20, 2, head_dim, dtype=dtype, device="meta")
    v = torch.empty(1, 20, 20, 2, value_dim or head_dim, dtype=dtype, device="meta")
    return build_problem(q, q, v, 7)


@pytest.mark.parametrize("dtype, head_dim, value_dim, every", [
    (torch.bfloat16, 16, None, 2), (torch.float16, 32, None, 2), (torch.bfloat16, 64, None, 4),
    (torch.bfloat16, 32, 64, 4), (torch.bfloat16, 128, None, 0), (torch.float16, 96, None, 0),
    (torch.float32, 32, None, 0), (torch.float32, 64, None, 0)])
def test_a_split_rule_goes_by_the_widest_16bit_head(dtype, head_dim, value_dim, every, monkeypatch):
    problem = _problem(dtype, head_dim, value_dim)
    # the shipped default splits nothing (measured slower: tiles.EXP2_SPLIT_EVERY) ...
    assert tiles.default_config(problem)["fwd"]["exp2_split"] == 0
    # ... and every split is a tuning candidate of a 16-bit problem
    candidates = {c["fwd"]["exp2_split"] for c in tiles.candidate_configs(problem)}
    assert candidates == (set(tiles.EXP2_SPLIT_CHOICES) if dtype != torch.float32 else {0})
    # a rule by head width, as a new GPU's measurements might set one
    monkeypatch.setattr(tiles, "EXP2_SPLIT_EVERY", {32: 2, 64: 4})
    assert tiles.exp2_split_every(problem) == every


@pytest.mark.parametrize("value", [3, 1, -4, "4", None])
def test_a_config_with_another_split_is_refused_by_name(value):
    with pytest.raises(ValueError, match=r"config\['fwd'\]\['exp2_split'\] = .*one of \(0, 2, 4\)"):
        tiles.normalise({"fwd": {"exp2_split": value}}, _problem(torch.bfloat16, 64))


def _built_for_sm90() -> dict:
    """MUFU.EX2 counts (and spills, serialised wgmma) of the D=64 forward built for sm_90 with each
    split, plus a thread's scores a tile. Run in a child process (see the test below)."""
    sys.path.insert(0, BENCHMARKS)
    from sm90_compile import captured_launches, compile_captured

    problem = _problem(torch.bfloat16, 64)
    q = torch.empty(1, 20, 20, 2, 64, dtype=torch.bfloat16, device="meta")
    fwd = dict(tiles.default_config(problem)["fwd"], pack=1)
    built = {"scores": math.prod(fwd["q"]) * math.prod(fwd["kv"]) // (32 * fwd["warps"])}
    for every in (0, 4):
        with captured_launches(launch) as sink:
            launch.forward(problem, AttentionInputs(q, q, q), {"fwd": dict(fwd, exp2_split=every)})
        (fn, _, args, kwargs), = [c for c in sink if c[0].__name__ == "forward_kernel"]
        row = compile_captured(fn, args, kwargs, f"exp2_split_{every}")
        built[every] = {key: row[key] for key in ("MUFU.EX2", "spills", "wgmma_serialized")}
    return built


def test_forward_for_sm90_moves_one_exp2_in_every_off_the_multi_function_unit():
    sys.path.insert(0, BENCHMARKS)
    from sm90_compile import tool

    if not os.path.exists(tool("ptxas")):
        pytest.skip("Triton's bundled ptxas is missing")
    # in a child process without TRITON_INTERPRET: kernels defined while the CPU suite
    # interprets cannot be compiled (as test_sm90_compile.compile_in_child)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    child = subprocess.run([sys.executable, os.path.abspath(__file__)], env=env, capture_output=True, text=True,
                           timeout=600)
    lines = [line for line in child.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, child.stdout[-2000:] + child.stderr[-2000:]
    built = json.loads(lines[-1][len("RESULT "):])
    # a quarter of a thread's scores a tile on the FMA pipe; the rescale's exp2s of the row
    # maxima stay on the multi-function unit
    assert built["0"]["MUFU.EX2"] - built["4"]["MUFU.EX2"] == built["scores"] // 4
    assert built["4"]["spills"] == 0 and not built["4"]["wgmma_serialized"]


if __name__ == "__main__":
    print("RESULT " + json.dumps(_built_for_sm90()))
