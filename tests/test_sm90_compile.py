"""Every Triton kernel compiles for sm_90 (H100/H200) with each feature, on a machine without a GPU.

The CPU tests run the kernels in Triton's interpreter, which executes them as Python: it cannot
see what only the compiler rejects (a loop-carried value that changes type, a constexpr used as a
tensor, a layout the MMA lowering refuses). Here each backend's launch code runs on meta tensors
with its launches captured (benchmarks/sm90_compile.py) and every captured kernel is built for
sm_90 with the ptxas that Triton bundles, as the JIT would build it on an H100, and must fit the
H100's registers and shared memory. tests/test_arch_compile.py builds some of these cases for the
other GPU generations with the same machinery (compile_in_child, check_kernels_run).
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
from sm90_compile import GPUS, captured_launches, compile_captured, tool  # noqa: E402

from haloattn.backend import AttentionInputs  # noqa: E402
from haloattn.backends.triton import jvp_launch, launch, tiles, window_launch  # noqa: E402
from haloattn.backends.triton.window_plugin import shared_memory_reasons  # noqa: E402
from haloattn.problem import build_problem  # noqa: E402

pytestmark = pytest.mark.skipif(not os.path.exists(tool("ptxas")), reason="Triton's bundled ptxas is missing")

# Mods compiled into the kernels (mod_codegen): a captured bias table read per pair, a gate, a mask.
_BIAS_TABLE = torch.empty(4, 64, device="meta")


def _biased_below_the_diagonal(s, b, h, q_idx, kv_idx):
    return torch.where(kv_idx <= q_idx, s + _BIAS_TABLE[h, (q_idx - kv_idx) % 64], torch.tanh(s) * 2.0)


def _every_fifth_offset_masked(b, h, q_idx, kv_idx):
    return (q_idx - kv_idx) % 5 != 2

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
    # Head dims 160 / 80: the kernels' block and tail (tiles.head_split), the backward waiting for
    # its products within each step above head dim 128 (tiles.wide_backward).
    "neighbourhood_2d_split_heads_hd160_dv80": (launch, (16, 16), 5, torch.bfloat16, 2, 2, 160, 80, False, 0, {}),
    # Packed forward programs (several (batch, head) pairs a program), with a bias per head; head
    # dim 64 keeps the 64-query wgmma forward whose asynchrony the test below checks.
    "neighbourhood_2d_packed_pairs_rpb": (launch, (14, 14), 7, torch.bfloat16, 4, 2, 64, 64, True, 0, {}),
    # Narrow heads on a small window: one-warp mma.sync forward on 16 queries, 32-token backward.
    "neighbourhood_2d_narrow_small_tiles": (launch, (28, 28), 7, torch.bfloat16, 4, 2, 32, 32, False, 0, {}),
    # float32 (TF32 off: three-part products) at head dim 256 on its own forward tiles
    # (tiles.EXACT_FLOAT32_FORWARD_TILES), whose spills test_float32_forward_spills_little checks.
    "neighbourhood_2d_float32_hd256_gqa": (launch, (12, 14), (5, 7), torch.float32, 4, 2, 256, 256, False, 0,
                                           dict(dilation=(2, 1))),
    # float32 at 8-16 channels: one-warp forward and backward (tiles.EXACT_FLOAT32_BACKWARD), causal in time.
    "neighbourhood_3d_float32_hd16_causal_rpb": (launch, (4, 9, 10), (3, 3, 5), torch.float32, 4, 2, 16, 8, True, 0,
                                                 dict(causal=(True, False, False))),
    # A small window at head dim 256: the backward on 16 / 32-token two-warp tiles
    # (tiles.SMALL_WINDOW_BACKWARD_TILES), with the bias's gradient.
    "neighbourhood_2d_small_window_hd256_rpb": (launch, (16, 18), 5, torch.bfloat16, 4, 2, 256, 256, True, 0, {}),
    # Head dim 256 where 32 / 64-token backward tiles on 4 warps save pairs (tiles.WIDE_256_BACKWARD_TILES).
    "neighbourhood_3d_wide_hd256_four_warps": (launch, (8, 12, 12), (3, 7, 7), torch.bfloat16, 4, 2, 256, 256, False, 0,
                                               {}),
    # A 3-D video-like window at head dim 64, whose dK/dV kernel takes boxes of its own: 32-token
    # streamed boxes of another shape than dQ's (tiles.KEY_MAJOR_BOXES).
    "neighbourhood_3d_key_major_boxes_hd64": (launch, (10, 20, 20), (5, 9, 9), torch.bfloat16, 4, 2, 64, 64, False, 0,
                                              {}),
    # score_mod and mask_mod with rpb, softcap and additional tokens (every hook of every kernel).
    "neighbourhood_2d_mods_rpb_softcap_extra_keys": (launch, (16, 16), 5, torch.bfloat16, 4, 2, 64, 64, True, 3,
                                                     dict(softcap=30.0, score_mod=_biased_below_the_diagonal,
                                                          mask_mod=_every_fifth_offset_masked)),
    "neighbourhood_3d_float32_mask_mod_causal": (launch, (4, 8, 8), (3, 5, 5), torch.float32, 2, 2, 32, 32, False, 0,
                                                 dict(causal=(True, False, False),
                                                      mask_mod=_every_fifth_offset_masked)),
    "window_swin_shift_rpb": (window_launch, (14, 14), 7, torch.float16, 3, 3, 32, 32, True, 0, dict(shift=3)),
    "window_3d_dilated_causal_gqa_softcap": (window_launch, (4, 8, 8), (2, 2, 4), torch.float32, 4, 2, 30, 16,
                                             True, 0, dict(dilation=(1, 2, 2), causal=(True, False, False),
                                                           softcap=10.0)),
    "window_12x12_long": (window_launch, (24, 24), 12, torch.bfloat16, 2, 2, 64, 64, True, 0, dict(shift=6)),
    # float32 windows at head dim 64: ptxas built the backward for sm_80 with 32 registers and 26 KB
    # of spill stores a thread, for sm_89 with 40 and 22 KB (device_limits.built_degenerately).
    "window_8x8_float32_hd64": (window_launch, (16, 16), 8, torch.float32, 2, 2, 64, 64, True, 0, dict(shift=4)),
}
# Spill stores a thread any kernel of the cases may have on any target: the largest, the float32
# window backward at head dim 64 rebuilt capped on sm_80, spills 6.6 KB (2.7 KB on sm_90); built
# degenerately (device_limits.built_degenerately) it spilled 26 KB, other such builds 6-320 KB.
MAX_SPILL_BYTES = 8192


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


def compile_case(name: str, capability: int = 90) -> list:
    """Capture the case's forward and backward (and forward-mode) launches as the launchers make
    them on the GPU of ``capability`` (sm90_compile.GPUS) and build each for it: per kernel its
    name, registers, whether ptxas serialised its wgmmas, its shared memory in bytes, and the
    shared memory of each refit the launcher would make (``refits``, see _refits)."""
    launcher, *spec = CASES[name]
    problem, inputs = _problem(*spec)
    gpu = GPUS[capability]
    outcomes = []
    for fn, args, kwargs in _capture(name, launcher, problem, inputs, gpu):
        outcome = _build(fn, args, kwargs, f"sm{capability}-{name}-{fn.__name__}", capability)
        outcome["refits"] = _refits(name, launcher, problem, inputs, gpu, outcome)
        outcomes.append(outcome)
    return outcomes


def _capture(name, launcher, problem, inputs, gpu, config=None) -> list:
    """(kernel, args, kwargs) of every launch the case's forward, backward and (neighbourhood)
    forward-mode calls make on ``gpu`` with ``config`` (default: the case's)."""
    from unittest import mock

    # Host-side reductions after the kernels (the rpb gradient's bincount, say) have no meta kernel.
    # Mods on meta tensors are compiled unchecked (the check runs the user's functions on values).
    with mock.patch.object(launch, "rpb_gradient", lambda *args: None), \
            mock.patch.object(window_launch, "table_gradient", lambda *args: None), \
            mock.patch.object(launch, "fused_mods", _unchecked_mods), \
            mock.patch.object(jvp_launch, "fused_mods", _unchecked_mods), \
            captured_launches(launcher, gpu) as sink:
        config = config or _forward_packing(name, problem)
        out, lse = launcher.forward(problem, inputs, config)
        needs = (True, True, True, inputs.rpb is not None, False, problem.extra_tokens > 0, problem.extra_tokens > 0)
        launcher.backward(problem, inputs, out, lse, torch.empty_like(out), torch.empty_like(lse), needs, config)
        if launcher is launch:  # the forward-mode rule, every input moving
            jvp_launch.jvp(problem, inputs, inputs, out, lse, config)
    return [(fn, args, kwargs) for fn, _, args, kwargs in sink]


def _unchecked_mods(problem):
    from haloattn.backends.triton import mod_codegen

    if not problem.has_mods:
        return None
    return mod_codegen.fused_mods(problem.score_mod, problem.mask_mod, problem.device)


def _build(fn, args, kwargs, label: str, capability: int) -> dict:
    """What the tests check of one launch built for ``sm_{capability}``."""
    row = compile_captured(fn, args, kwargs, label, capability=capability)
    return dict(kernel=fn.__name__, regs=row["regs"], spills=row["spills"], serialized=row["wgmma_serialized"],
                shared=row["shared"], invariant_register_operands=row["invariant_register_operands"])


def _forward_packing(name: str, problem):
    """The config of a FORWARD_PACK case (the default, with its forward packing pairs); None (the
    default) for the others. Called where the GPU's limits are in place: the default depends on them."""
    if name not in FORWARD_PACK:
        return None
    default = tiles.default_config(problem)
    return dict(default, fwd=dict(default["fwd"], pack=FORWARD_PACK[name]))


def _refits(name, launcher, problem, inputs, gpu, outcome) -> list:
    """Shared memory of the kernel after each refit the neighbourhood launcher makes where it
    compiled larger than ``gpu`` allows (launch._run_fitted: Triton refuses the launch, the
    config part that sets the kernel's tiles shrinks by the overshoot, up to launch.MAX_REFITS
    times); empty where the kernel fits, or where its launcher does not refit (the test then
    sees the overshoot). tiles.shrink_to_fit's ValueError (nothing left to shrink) propagates, as
    it would to the caller on the GPU."""
    kernel, shared = outcome["kernel"], outcome["shared"]
    if launcher is not launch or kernel not in launch.CONFIG_PART or shared <= gpu.shared_limit:
        return []
    with captured_launches(launcher, gpu):  # the configs the launcher starts from, on this GPU
        config = _forward_packing(name, problem) or _default_config_of(kernel, problem)
    sizes = []
    while shared > gpu.shared_limit and len(sizes) < launch.MAX_REFITS:
        with captured_launches(launcher, gpu):
            config = tiles.shrink_to_fit(problem, tiles.normalise(config, problem), launch.CONFIG_PART[kernel],
                                         shared - gpu.shared_limit)
        fn, args, kwargs = next(captured for captured in _capture(name, launcher, problem, inputs, gpu, config)
                                if captured[0].__name__ == kernel)
        shared = _build(fn, args, kwargs, f"sm{gpu.capability}-{name}-{kernel}-refit{len(sizes) + 1}",
                        gpu.capability)["shared"]
        sizes.append(shared)
    return sizes


def _default_config_of(kernel: str, problem):
    """The default config the launcher of ``kernel`` starts from (the exact-float32 one where
    float32 multiplies without tf32)."""
    return tiles.default_config(problem, exact_float32=launch.exact_float32_products(launch._precision(problem.dtype)))


def fits_shared_memory(outcome: dict, limit: int) -> bool:
    """Whether a compiled kernel runs within ``limit`` bytes of shared memory per block: as built,
    or after the launcher's refits."""
    return (outcome["refits"] or [outcome["shared"]])[-1] <= limit


def compile_in_child(capability: int, names, timeout: int = 1500):
    """Compile the named cases for ``sm_{capability}`` in a child process (this file run as a
    script): kernels defined while TRITON_INTERPRET=1 is set (the CPU suite sets it) are
    interpreter objects that cannot be compiled. Returns ({case: {"kernels": [...], "error": ...}},
    the tail of the child's output for failure messages)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    child = subprocess.run([sys.executable, os.path.abspath(__file__), "--capability", str(capability), *names],
                           env=env, capture_output=True, text=True, timeout=timeout)
    results = {}
    for line in child.stdout.splitlines():
        if line.startswith("RESULT "):
            results.update(json.loads(line[len("RESULT "):]))
    return results, child.stdout[-3000:] + child.stderr[-3000:]


@pytest.fixture(scope="module")
def compiled():
    """Every case, compiled for sm_90 (in a child process: compile_in_child)."""
    return compile_in_child(90, list(CASES))


def check_kernels_run(name: str, results: dict, log: str, gpu) -> None:
    """The case compiled for ``gpu``: no error, a forward and a backward, at most 255 registers and
    MAX_SPILL_BYTES of spill stores a thread, and each kernel within the GPU's shared memory per
    block (where Triton would refuse the launch with OutOfResources), after the launcher's refits;
    a window problem may exceed it where backend 'triton_window' hands such problems to 'triton'
    on this GPU instead."""
    assert name in results, f"the child process did not report {name}:\n{log}"
    outcome = results[name]
    assert outcome["error"] is None, f"{gpu.name} (sm_{gpu.capability}), {name}: {outcome['error']}"
    kernels = outcome["kernels"]
    assert len(kernels) >= 2, f"{name}: no forward and backward launches were captured"
    for row in kernels:
        assert row["regs"] is not None and row["regs"] <= 255, (gpu.name, row)
        assert row["spills"] is not None and row["spills"] <= MAX_SPILL_BYTES, (gpu.name, row)
    if CASES[name][0] is window_launch and _window_backend_declines(name, gpu):
        return
    too_large = [row for row in kernels if not fits_shared_memory(row, gpu.shared_limit)]
    assert not too_large, f"{gpu.name} (sm_{gpu.capability}) allows {gpu.shared_limit} bytes a block: {too_large}"


def _window_backend_declines(name: str, gpu) -> bool:
    """Whether backend 'triton_window' refuses the case on ``gpu`` for its shared memory."""
    problem, _ = _problem(*CASES[name][1:])
    return bool(shared_memory_reasons(problem, gpu.shared_limit))


@pytest.mark.parametrize("name", list(CASES))
def test_kernels_compile_for_sm90(name, compiled):
    check_kernels_run(name, *compiled, GPUS[90])


@pytest.mark.parametrize("name", [name for name, case in CASES.items() if case[0] is launch])
def test_jvp_kernel_compiles_with_asynchronous_wgmma(name, compiled):
    """The forward-mode kernel builds for every neighbourhood case (all tangents: q, k, v, rpb and
    the additional tokens'), and ptxas keeps its products asynchronous (an 8-warp build at head
    dim 128 serialised them: 2x slower than 4 warps on the H100, RESULTS.md "Forward-mode AD")."""
    results, log = compiled
    kernels = results.get(name, {}).get("kernels")
    assert kernels, log
    jvp = [(row["regs"], row["serialized"]) for row in kernels if row["kernel"] == "jvp_kernel"]
    assert len(jvp) == 1 and jvp[0][1] is False, jvp


def test_key_major_boxes_keep_the_dkdv_wgmma_asynchronous(compiled):
    """The dK/dV kernel on boxes of its own (32-token streamed boxes at head dim 64) builds for
    sm_90 without ptxas serialising its wgmmas and in fewer registers than 4 warps allow."""
    results, log = compiled
    kernels = results.get("neighbourhood_3d_key_major_boxes_hd64", {}).get("kernels")
    assert kernels, log
    dkdv = [(row["regs"], row["serialized"]) for row in kernels if row["kernel"] == "dkdv_kernel"]
    assert len(dkdv) == 1 and dkdv[0][1] is False and dkdv[0][0] < 255, dkdv


def test_packed_forward_keeps_its_wgmma_asynchronous(compiled):
    """A packed forward program stores a finished pair's rows where the online softmax reads the
    accumulator anyway; stored right after the pair's last product instead, the branch made ptxas
    serialise every wgmma of the loop (long walks 2x slower on the H100)."""
    results, log = compiled
    kernels = results.get("neighbourhood_2d_packed_pairs_rpb", {}).get("kernels")
    assert kernels, log
    forward = [row["serialized"] for row in kernels if row["kernel"] == "forward_kernel"]
    assert forward == [False]


@pytest.mark.parametrize("name", list(CASES))
def test_no_loop_reads_a_register_fragment_it_never_writes(name, compiled):
    """No kernel has a wgmma in a loop whose A fragment comes from registers the loop never
    writes (ptx_register_operands.py): ptxas 12.8 and 13.0 gave such a fragment's registers to
    other values of the loop in the query-box forward (wrong results on the H100, RESULTS.md
    "Query-tile boxes"). Loop-invariant operands stay in shared memory."""
    results, log = compiled
    kernels = results.get(name, {}).get("kernels")
    assert kernels, log
    invariant = [(row["kernel"], row["invariant_register_operands"]) for row in kernels
                 if row["invariant_register_operands"]]
    assert not invariant, invariant


def test_float32_forward_spills_little(compiled):
    """The float32 forward at head dim 256 spills at most a kilobyte a thread on sm_90: on the
    16-bit cost model's tiles it spilled 2.4-2.7 KB and ran 4.3-4.9x slower on an H200
    (RESULTS.md, "Float32 forward tiles"); the tiles it takes now spill 60-250 bytes."""
    results, log = compiled
    kernels = results.get("neighbourhood_2d_float32_hd256_gqa", {}).get("kernels")
    assert kernels, log
    forward = [row["spills"] for row in kernels if row["kernel"] == "forward_kernel"]
    assert len(forward) == 1 and forward[0] <= 1024, forward


def _main(argv) -> None:
    """``[--capability N] [case ...]``: compile the cases (default all) for sm_N (default 90) and
    print one ``RESULT {json}`` line per case."""
    capability = 90
    if argv[:1] == ["--capability"]:
        capability, argv = int(argv[1]), argv[2:]
    for case in argv or CASES:
        try:
            outcome = {"kernels": compile_case(case, capability), "error": None}
        except Exception as exc:  # reported per case by the test
            outcome = {"kernels": [], "error": f"{type(exc).__name__}: {str(exc)[-1500:]}"}
        print("RESULT " + json.dumps({case: outcome}), flush=True)


if __name__ == "__main__":
    _main(sys.argv[1:])
