"""Every Triton kernel compiles for sm_90 (H100/H200) with each feature, on a machine without a GPU.

The CPU tests run the kernels in Triton's interpreter, which executes them as Python: it cannot
see what only the compiler rejects (a loop-carried value that changes type, a constexpr used as a
tensor, a layout the MMA lowering refuses). Here each backend's launch code runs on meta tensors
with its launches captured (benchmarks/sm90_compile.py) and every captured kernel is built for
sm_90 with the ptxas that Triton bundles, as the JIT would build it on an H100.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

triton = pytest.importorskip("triton")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
from sm90_compile import captured_launches, compile_captured, tool  # noqa: E402

from haloattn.backend import AttentionInputs  # noqa: E402
from haloattn.backends.triton import jvp_launch, launch, tiles, window_launch  # noqa: E402
from haloattn.problem import build_problem  # noqa: E402

pytestmark = pytest.mark.skipif(not os.path.exists(tool("ptxas")), reason="Triton's bundled ptxas is missing")

# name: (launcher, spatial, window, dtype, heads, kv_heads, head_dim, value_dim, rpb, extra tokens, options)
CASES = {
    "neighbourhood_2d_rpb_softcap": (launch, (16, 16), 5, torch.bfloat16, 2, 2, 64, 64, True, 0,
                                     dict(softcap=20.0)),
    "neighbourhood_1d_causal_strided_dilated_gqa": (launch, (64,), 7, torch.float32, 4, 2, 32, 16, False, 0,
                                                    dict(causal=True, stride=2, dilation=2)),
    "neighbourhood_3d_window_shift_extra_keys": (launch, (4, 8, 8), (2, 4, 4), torch.float16, 2, 1, 128, 128,
                                                 False, 5, dict(pattern="window", shift=(1, 2, 2))),
    # head_dim 192: 128-query dQ tiles against 64-key tiles (non-square pair masks).
    "neighbourhood_2d_causal_hd192_dv64": (launch, (10, 12), (5, 3), torch.bfloat16, 2, 1, 192, 64, False, 0,
                                           dict(causal=(True, False))),
    # Packed forward programs (several (batch, head) pairs a program), with a bias per head.
    "neighbourhood_2d_packed_pairs_rpb": (launch, (14, 14), 7, torch.bfloat16, 4, 2, 32, 32, True, 0, {}),
    "window_swin_shift_rpb": (window_launch, (14, 14), 7, torch.float16, 3, 3, 32, 32, True, 0, dict(shift=3)),
    "window_3d_dilated_causal_gqa_softcap": (window_launch, (4, 8, 8), (2, 2, 4), torch.float32, 4, 2, 30, 16,
                                             True, 0, dict(dilation=(1, 2, 2), causal=(True, False, False),
                                                           softcap=10.0)),
    "window_12x12_long": (window_launch, (24, 24), 12, torch.bfloat16, 2, 2, 64, 64, True, 0, dict(shift=6)),
}


def _problem(spatial, window, dtype, heads, kv_heads, head_dim, value_dim, rpb, extra, options):
    def meta(*shape, dt=dtype):
        return torch.empty(*shape, device="meta", dtype=dt)

    q = meta(1, *spatial, heads, head_dim)
    k = meta(1, *spatial, kv_heads, head_dim)
    v = meta(1, *spatial, kv_heads, value_dim)
    window_per_axis = window if isinstance(window, tuple) else (window,) * len(spatial)
    table = meta(heads, *(2 * w - 1 for w in window_per_axis), dt=torch.float32) if rpb else None
    ak = meta(1, extra, kv_heads, head_dim) if extra else None
    av = meta(1, extra, kv_heads, value_dim) if extra else None
    options = dict(options)
    options.setdefault("pattern", "window" if "shift" in options else "neighborhood")
    if options["pattern"] == "neighborhood":
        options.pop("shift", None)
    problem = build_problem(q, k, v, window, rpb=table, additional_keys=ak, additional_values=av, **options)
    return problem, AttentionInputs(q, k, v, table, None, ak, av)


# Cases whose forward runs this many pairs a program (not the default at their small size).
FORWARD_PACK = {"neighbourhood_2d_packed_pairs_rpb": 4}


def compile_case(name: str) -> list:
    """Capture the case's forward and backward launches and build each for sm_90: (kernel, regs,
    whether ptxas serialised its wgmmas)."""
    from unittest import mock

    launcher, *spec = CASES[name]
    problem, inputs = _problem(*spec)
    config = None
    if name in FORWARD_PACK:
        default = tiles.default_config(problem)
        config = dict(default, fwd=dict(default["fwd"], pack=FORWARD_PACK[name]))
    # Host-side reductions after the kernels (the rpb gradient's bincount, say) have no meta kernel.
    with mock.patch.object(launch, "rpb_gradient", lambda *args: None), \
            mock.patch.object(window_launch, "table_gradient", lambda *args: None), \
            captured_launches(launcher) as sink:
        out, lse = launcher.forward(problem, inputs, config)
        needs = (True, True, True, inputs.rpb is not None, False, problem.extra_tokens > 0, problem.extra_tokens > 0)
        launcher.backward(problem, inputs, out, lse, torch.empty_like(out), torch.empty_like(lse), needs, config)
        if launcher is launch:  # the forward-mode rule, every input moving
            jvp_launch.jvp(problem, inputs, inputs, out, lse, config)
    compiled = [(fn.__name__, compile_captured(fn, args, kwargs, f"{name}-{fn.__name__}"))
                for fn, _, args, kwargs in sink]
    return [(kernel, row["regs"], row["wgmma_serialized"]) for kernel, row in compiled]


@pytest.fixture(scope="module")
def compiled():
    """Every case, compiled in a child process: kernels defined while TRITON_INTERPRET=1 is set
    (the CPU suite sets it) are interpreter objects that cannot be compiled."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    child = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True, timeout=1500)
    results = {}
    for line in child.stdout.splitlines():
        if line.startswith("RESULT "):
            results.update(json.loads(line[len("RESULT "):]))
    return results, child.stdout[-3000:] + child.stderr[-3000:]


@pytest.mark.parametrize("name", list(CASES))
def test_kernels_compile_for_sm90(name, compiled):
    results, log = compiled
    assert name in results, f"the child process did not report {name}:\n{log}"
    outcome = results[name]
    assert outcome["error"] is None, f"{name}: {outcome['error']}"
    kernels = outcome["kernels"]
    assert len(kernels) >= 2, f"{name}: no forward and backward launches were captured"
    for kernel, regs, _ in kernels:
        assert regs is not None and regs <= 255, (kernel, regs)


@pytest.mark.parametrize("name", [name for name, case in CASES.items() if case[0] is launch])
def test_jvp_kernel_compiles_with_asynchronous_wgmma(name, compiled):
    """The forward-mode kernel builds for every neighbourhood case (all tangents: q, k, v, rpb and
    the additional tokens'), and ptxas keeps its products asynchronous (an 8-warp build at head
    dim 128 serialised them: 2x slower than 4 warps on the H100, RESULTS.md "Forward-mode AD")."""
    results, log = compiled
    kernels = results.get(name, {}).get("kernels")
    assert kernels, log
    jvp = [(regs, serialized) for kernel, regs, serialized in kernels if kernel == "jvp_kernel"]
    assert len(jvp) == 1 and jvp[0][1] is False, jvp


def test_packed_forward_keeps_its_wgmma_asynchronous(compiled):
    """A packed forward program stores a finished pair's rows where the online softmax reads the
    accumulator anyway; stored right after the pair's last product instead, the branch made ptxas
    serialise every wgmma of the loop (long walks 2x slower on the H100)."""
    results, log = compiled
    kernels = results.get("neighbourhood_2d_packed_pairs_rpb", {}).get("kernels")
    assert kernels, log
    forward = [serialized for kernel, _, serialized in kernels if kernel == "forward_kernel"]
    assert forward == [False]


if __name__ == "__main__":
    for case in CASES:
        try:
            outcome = {"kernels": compile_case(case), "error": None}
        except Exception as exc:  # reported per case by the test
            outcome = {"kernels": [], "error": f"{type(exc).__name__}: {str(exc)[-1500:]}"}
        print("RESULT " + json.dumps({case: outcome}), flush=True)
