"""Host side of the short-window kernels: a Problem becomes rank-3 launch arguments, the rpb table
becomes the dense per-head ``BLOCK x BLOCK`` bias tile the kernels read, and the kernels' partial
results (GQA dK/dV per query head, rpb gradient per program) are reduced here, deterministically."""

from __future__ import annotations

import functools
import math
from typing import NamedTuple, Optional, Tuple

import torch
import triton

from .device_constants import device_constant
from .device_limits import multiprocessors
from .fast_launch import Launch, cached, config_key, plan_cache, tensor_layout
from .plugin import interpreting
from .relative_fold import fold_into_table, slots_of_entries
from .window_kernels import window_backward_kernel, window_forward_kernel

MAX_WINDOW_TOKENS = 256
MAX_HEAD_DIM = 128
# Windows of up to SQUARE_TILE_MAX (padded) tokens keep their whole square score tile on chip;
# larger ones run the long-window kernels (window_long_launch.py: the window cut into parts of at
# most 64 slots, online softmax over the key parts; a 256 x 256 tile would need more shared memory
# than an H100 has).
SQUARE_TILE_MAX = 128
# The narrowest channel tile (head dim, value dim) of float32 problems. With 16-channel float32
# tiles (64-byte rows, as with 16-slot window parts: window_long_launch.MIN_PART_FLOAT32) Triton
# 3.6 compiled the long-window dQ kernel of a 253-token 1-D window, head dim 16, into an illegal
# address on an H100 (random GPU test seed 2117, RESULTS.md 2026-11-27); the channels past the head
# dim are masked off in every load and store, so a wider tile costs only the idle columns.
MIN_CHANNELS_FLOAT32 = 32


def is_long(launch: "WindowLaunch") -> bool:
    """Whether a problem's windows run the long-window kernels."""
    return launch.block > SQUARE_TILE_MAX


# Shared memory (bytes) of the forward and backward kernels at their default launch settings,
# compiled for sm_90 (benchmarks/window_shared_memory.py --capability 90; first measured with
# benchmarks/compile_report_window.py, 2026-11-23; the float32 forward's of
# 64-slot tiles 2026-11-25, with its bias tile reloaded per window), by tile class (padded
# window: 64 slots or fewer, 128, or the long-window kernels beyond), bytes per element and padded
# head dim (32 or fewer, 64, 128). The plugin compares them with the GPU's per-block limit (H100:
# 227 KiB), so a problem whose kernels cannot launch goes to backend 'triton' instead of failing
# there.
SHARED_MEMORY = {
    (64, 2, 32): (40960, 41216), (64, 2, 64): (81920, 73984), (64, 2, 128): (106496, 73728),
    (64, 4, 32): (98304, 90368), (64, 4, 64): (98304, 65536), (64, 4, 128): (180224, 98304),
    (128, 2, 32): (81920, 98816), (128, 2, 64): (114688, 98304), (128, 2, 128): (229376, 163840),
    (128, 4, 32): (81920, 163840), (128, 4, 64): (163840, 196608), (128, 4, 128): (327680, 262144),
    # Long windows (window_long_kernels.py): the larger of 12x12 and 16x16. Measured again on
    # 2026-11-28 with benchmarks/window_shared_memory.py (every other entry came out the same): the
    # float32 head-dim-32 forward had grown to 104 KiB, the 16-bit head-dim-64 backward shrunk to 40.
    (256, 2, 32): (143360, 161792), (256, 2, 64): (135168, 40960), (256, 2, 128): (65536, 81920),
    (256, 4, 32): (106496, 81920), (256, 4, 64): (32768, 131072), (256, 4, 128): (65536, 229376),
}


def shared_memory_needed(problem) -> int:
    """Bytes of shared memory per block the problem's forward and backward kernels need (the
    larger), from SHARED_MEMORY."""
    volume = math.prod(problem.window)
    tile = 64 if volume <= 64 else 128 if volume <= SQUARE_TILE_MAX else 256
    dim = max(32, 1 << max(0, max(problem.head_dim, problem.value_dim) - 1).bit_length())
    return max(SHARED_MEMORY[(tile, problem.dtype.itemsize, dim)])


class WindowLaunch(NamedTuple):
    """Per-problem launch constants, every axis padded in front to rank 3 (length 1, window 1)."""

    lengths: Tuple[int, int, int]
    windows: Tuple[int, int, int]
    dilations: Tuple[int, int, int]
    causal: Tuple[bool, bool, bool]
    offsets: Tuple[int, int, int]  # window w of an axis starts at group coordinate w * W - offset
    windows_per_axis: Tuple[int, int, int]  # per dilation group (the largest group's count)
    num_windows: int
    block: int
    block_d: int
    block_dv: int


def plan(problem) -> WindowLaunch:
    """Launch constants of a problem, computed once per problem (host time per call); the tile
    limits are part of the key so that changing them (tests shrink them) takes effect."""
    return _plan(problem, SQUARE_TILE_MAX, MIN_CHANNELS_FLOAT32)


@functools.lru_cache(maxsize=256)
def _plan(problem, square_tile_max: int, min_channels_float32: int) -> WindowLaunch:
    pad = 3 - problem.rank
    axes = problem.axes
    lengths = (1,) * pad + tuple(a.length for a in axes)
    windows = (1,) * pad + tuple(a.window for a in axes)
    dilations = (1,) * pad + tuple(a.dilation for a in axes)
    causal = (False,) * pad + tuple(a.causal for a in axes)
    # With shift s the first window of an axis is [0, s): window w starts at w * W - (W - s).
    offsets = (0,) * pad + tuple((a.window - a.shift) % a.window for a in axes)
    per_axis = []
    for L, W, Dl, off in zip(lengths, windows, dilations, offsets):
        largest_group = -(-L // Dl)
        per_axis.append((largest_group - 1 + off) // W + 1)
    # Every axis enumerates (dilation group, window); windows that fall outside a short group are
    # empty and their programs store nothing.
    num_windows = problem.batch * math.prod(n * d for n, d in zip(per_axis, dilations))
    block = max(16, triton.next_power_of_2(math.prod(windows)))
    least_channels = min_channels_float32 if problem.dtype == torch.float32 else 16
    return WindowLaunch(
        lengths, windows, dilations, causal, offsets, tuple(per_axis), num_windows,
        block=block,
        block_d=max(least_channels, triton.next_power_of_2(problem.head_dim)),
        block_dv=max(least_channels, triton.next_power_of_2(problem.value_dim)),
    )


INT32_LIMIT = 2**31 - 1
LOG2E = 1.4426950408889634


def _strides(t: torch.Tensor, rank: int, align: int = 1):
    """(batch, axis0, axis1, axis2, head) strides with the spatial axes padded to rank 3, divided by
    ``align`` (see window_kernels: ALIGN). The channel stride is 1."""
    return _padded_strides(t.stride(), rank, align)


@functools.lru_cache(maxsize=1024)
def _padded_strides(s: Tuple[int, ...], rank: int, align: int):
    outer = (s[0],) + (0,) * (3 - rank) + tuple(s[1:1 + rank]) + (s[1 + rank],)
    return tuple(x // align for x in outer)


def _unit_channels(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """The kernels read each token's channels as one contiguous vector."""
    if t is None or t.stride(-1) == 1:
        return t
    return t.contiguous()


def _row_alignment(rank: int, *tensors: torch.Tensor) -> int:
    """Largest power of two (at most 8 elements) dividing every batch/spatial/head stride: the
    kernels assert it on row offsets so loads stay vectorised although those strides are not
    specialised (and a head stride such as 30 would otherwise leave rows 1-element aligned)."""
    strides = [x for t in tensors for x in _strides(t, rank)]
    align = 8
    while align > 1 and any(s % align for s in strides):
        align //= 2
    return align


def batch_element_span(t: torch.Tensor) -> int:
    """Elements one batch element of ``t`` spans: the kernels index inside it with int32."""
    return _span(tuple(t.shape[1:]), t.stride()[1:])


@functools.lru_cache(maxsize=1024)
def _span(shape: Tuple[int, ...], stride: Tuple[int, ...]) -> int:
    return 1 + sum((n - 1) * abs(st) for n, st in zip(shape, stride) if n > 0)


def _check_int32(*tensors) -> None:
    for t in tensors:
        if t is not None and batch_element_span(t) > INT32_LIMIT:
            raise ValueError(
                f"a tensor of shape {tuple(t.shape)} and strides {t.stride()} spans {batch_element_span(t)} "
                f"elements per batch element; triton_window indexes a batch element with int32 (at most "
                f"{INT32_LIMIT}): pass contiguous tensors or use backend='triton'"
            )


def _grid_args(launch: WindowLaunch, problem):
    return (
        problem.batch, *launch.lengths, *launch.windows_per_axis, *launch.offsets, *launch.dilations,
        launch.num_windows,
    )


def _precision(dtype: torch.dtype) -> str:
    """float16/bfloat16 products are exact in float32 accumulation whatever this says. float32
    inputs: three TF32 products per product ("tf32x3", error ~1e-6, inside the float32 tolerance of
    SEMANTICS.md section 7) on the tensor cores; one TF32 product (tolerance 3e-3) only when the
    user allowed TF32 matmuls, as for every other backend."""
    if dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32:
        return "tf32"
    return "tf32x3"


def _meta(launch: WindowLaunch, problem, inputs_dtype):
    return dict(
        W0=launch.windows[0], W1=launch.windows[1], W2=launch.windows[2],
        CAUSAL0=launch.causal[0], CAUSAL1=launch.causal[1], CAUSAL2=launch.causal[2],
        BLOCK=launch.block, BLOCK_D=launch.block_d, BLOCK_DV=launch.block_dv,
        D=problem.head_dim, DV=problem.value_dim,
        HAS_SOFTCAP=problem.softcap is not None,
        PRECISION=_precision(inputs_dtype),
        UPCAST=inputs_dtype == torch.bfloat16 and interpreting(),
    )


def _dilated_axes(launch: WindowLaunch) -> dict:
    """Which axes are dilated: a property of the problem, not of the grid size, so compiling it in
    (the kernels skip undilated axes' dilation-group arithmetic) costs no recompilation."""
    return {f"DILATED{axis}": dilation > 1 for axis, dilation in enumerate(launch.dilations)}


def _bias_index(windows: Tuple[int, int, int], block: int, device: torch.device):
    """For every (query slot, key slot) of the tile, the flat rpb-table index of key minus query
    per axis plus W - 1 (NATTEN's orientation), and whether both slots are window slots (built
    once per device: device_constants)."""
    return device_constant(("bias_index", windows, block, device), device,
                           lambda: _build_bias_index(windows, block, device))


def _build_bias_index(windows: Tuple[int, int, int], block: int, device: torch.device):
    volume = math.prod(windows)
    slot = torch.arange(block, device=device)
    coords = []
    rest = slot
    for W in reversed(windows):
        coords.append(rest % W)
        rest = rest // W
    coords.reverse()
    index = torch.zeros(block, block, dtype=torch.long, device=device)
    for c, W in zip(coords, windows):
        index = index * (2 * W - 1) + (c[None, :] - c[:, None] + W - 1)
    inside = (slot[:, None] < volume) & (slot[None, :] < volume)
    return torch.where(inside, index, 0), inside


def dense_bias(rpb: torch.Tensor, launch: WindowLaunch, problem) -> torch.Tensor:
    """``[H, BLOCK, BLOCK]`` float32 bias tile gathered from the ``[H, 2W-1, ...]`` table; in log2
    units (times log2 e) unless softcap applies after the bias (window_kernels._scores)."""
    index, inside = _bias_index(launch.windows, launch.block, rpb.device)
    table = rpb.detach().reshape(rpb.shape[0], -1).float()
    if problem.softcap is None:
        table = table * LOG2E
    return torch.where(inside, table[:, index], 0.0).contiguous()


def _window_slots(windows: Tuple[int, int, int], device: torch.device):
    """Per axis, ``slots_of_entries`` of a window: query coordinate x's key slot p (the key's
    coordinate) holds table entry p - x + W - 1. Built once per device (device_constants): a
    training step's backward should not rebuild them."""
    return device_constant(("window_slots", windows, device), device, lambda: tuple(
        slots_of_entries(W - 1 - torch.arange(W, device=device), W) for W in windows))


def table_gradient(dbias: torch.Tensor, rpb: torch.Tensor, launch: WindowLaunch) -> torch.Tensor:
    """Fold the ``[H, BLOCK, BLOCK]`` bias-tile gradient into the rpb table's shape, axis by axis
    (relative_fold: a fixed summation order, deterministic on CUDA; float64 so that TF32 matmul
    settings cannot touch it). Tile slots past the window's tokens carry no bias."""
    volume = math.prod(launch.windows)
    per_pair = dbias[:, :volume, :volume].double().reshape(dbias.shape[0], *launch.windows, *launch.windows)
    grad = fold_into_table(per_pair, _window_slots(launch.windows, dbias.device))
    return grad.reshape(rpb.shape).to(rpb.dtype)


# Launch heuristics (config keys; benchmarks/bench_window.py --sweep measures the alternatives):
# each program walks a run of windows, software-pipelined NUM_STAGES deep, and the grid keeps
# about PROGRAMS_PER_SM programs per multiprocessor so the last wave is short.
PROGRAMS_PER_SM = 16
MAX_WINDOWS_PER_PROGRAM = 16
# Pipeline depth and warps, measured on the H100 (2026-11-23, bench_window.py --sweep, CUDA-graph
# timed, Swin-T stage 1). Forward: Triton 3.6 issues a pipelined loop's next loads at the END of
# the iteration and waits for them at the top of the next one, so 2 stages overlap nothing inside
# a program; 3 keep one window's loads in flight during this window's math (16-bit: the fastest
# of the sweep; 141 registers, 3 programs of 4 warps per SM). float32 with its bias tile reloaded
# per window (_reload_bias) takes 3 as well: 1.12-1.13x faster than 2 (sweep of 2026-11-25).
# Backward of square tiles: 2 stages and 4 warps (1.35-1.38x faster than 3 stages and 8 warps;
# timm Swin-T training 1.16x stock against 1.04x). Deeper pipelines only where the
# stage buffers stay under STAGE_BYTES; larger score tiles get 8 warps (_launch_config).
STAGE_BYTES = 128 * 1024
DEFAULTS = {
    "forward": dict(num_stages=3, num_warps=4),
    "backward": dict(num_stages=2, num_warps=4),
}


def _default_stages(kind: str, launch: WindowLaunch, element_size: int, reload_bias: bool = False) -> int:
    """Pipeline depth (see above) where the stage buffers fit in STAGE_BYTES, else one stage less
    (forward: 2 at least). The forward buffers Q, K, V per stage (and the bias tile where it
    reloads it), the backward K, V, Q, O, dO. float32 forwards that hold the bias tile in registers
    keep 2 (3 spilled)."""
    bd, bv = launch.block_d, launch.block_dv
    stages = DEFAULTS[kind]["num_stages"]
    if kind == "forward":
        per_stage, fallback = launch.block * (2 * bd + bv), 2
        if reload_bias:
            per_stage += launch.block * launch.block * 4 // element_size  # float32 tile
        elif element_size == 4:
            stages = 2
    else:
        per_stage, fallback = launch.block * (2 * bd + 3 * bv), 1
    return stages if stages * per_stage * element_size <= STAGE_BYTES else fallback


# The forward holds the head's bias tile in registers across its windows, except for float32
# inputs: there the tf32x3 products' operand splits already use every register, and the 32 a thread
# spends on a 64 x 64 bias tile made ptxas spill (Swin-T: 120 B); reloaded per window, the tile
# travels through the software pipeline's shared-memory stages like q, k and v, and nothing spills.
# Only for tiles of at most RELOAD_BIAS_SLOTS pairs, whose stage buffers stay small.
RELOAD_BIAS_SLOTS = 64 * 64


def _reload_bias(kind: str, launch: WindowLaunch, element_size: int) -> bool:
    return kind == "forward" and element_size == 4 and launch.block * launch.block <= RELOAD_BIAS_SLOTS


def _windows_per_program(launch: WindowLaunch, problem, device: torch.device, query_parts: int) -> int:
    if device.type != "cuda":
        return 2  # the interpreter: still exercises the loop over several windows
    pairs = launch.num_windows * problem.heads * query_parts
    return max(1, min(MAX_WINDOWS_PER_PROGRAM, pairs // (PROGRAMS_PER_SM * multiprocessors(device))))


def _launch_config(kind: str, launch: WindowLaunch, problem, device, config, query_parts: int,
                   element_size: int = 2) -> dict:
    """windows_per_program, num_stages, num_warps and (forward) reload_bias of one kernel (and
    maxnreg, a register cap, where the config sets one): the config's ``{kind}_...`` entries where
    given (autotuning, benchmarks), the defaults otherwise. ``element_size`` (of q) sizes the
    pipeline buffers."""
    config = config or {}
    chosen = dict(DEFAULTS[kind])
    chosen["reload_bias"] = bool(config.get(f"{kind}_reload_bias", _reload_bias(kind, launch, element_size)))
    chosen["num_stages"] = _default_stages(kind, launch, element_size, chosen["reload_bias"])
    if launch.block > 64:
        chosen["num_warps"] = 8  # keep the float32 score tile near 32-64 registers a thread
    chosen["windows_per_program"] = _windows_per_program(launch, problem, device, query_parts)
    for key in ("windows_per_program", "num_stages", "num_warps"):
        chosen[key] = int(config.get(f"{kind}_{key}", chosen[key]))
    if config.get(f"{kind}_maxnreg"):
        # A register cap (ptx .maxnreg): e.g. 128 fits 4 programs of 4 warps per SM where the
        # uncapped Swin-T float16 forward (166 registers) fits 3; ptxas spills ~100 B for it.
        chosen["maxnreg"] = int(config[f"{kind}_maxnreg"])
    return chosen


def _compile_options(cfg: dict) -> dict:
    """Triton launch options of a chosen config: warps, and a register cap where one is set
    (``maxnreg``: more programs per multiprocessor; the interpreter takes no such option)."""
    options = dict(num_warps=cfg["num_warps"])
    if cfg.get("maxnreg") and not interpreting():
        options["maxnreg"] = cfg["maxnreg"]
    return options


def _programs(launch: WindowLaunch, problem, windows_per_program: int, query_parts: int = 1) -> int:
    # -(-a // b), not triton.cdiv: from Python that is a JIT function call (~8 us of host time).
    return problem.heads * query_parts * -(-launch.num_windows // windows_per_program)


def key_value_grad_buffers(problem, q, k, v):
    """dK, dV outputs of the backward kernels. Under GQA a kernel program owns one query head and
    writes its share per query head, in float32 (no atomics across the heads of a group);
    ``sum_query_head_groups`` then sums each group."""
    if problem.heads == problem.kv_heads:
        return torch.empty_like(k), torch.empty_like(v)
    dk = torch.empty(*q.shape, dtype=torch.float32, device=q.device)
    dv = torch.empty(*q.shape[:-1], problem.value_dim, dtype=torch.float32, device=q.device)
    return dk, dv


def sum_query_head_groups(problem, dk, dv, k, v):
    """dK, dV per KV head from ``key_value_grad_buffers``' per-query-head partials."""
    if problem.heads == problem.kv_heads:
        return dk, dv
    group = problem.heads // problem.kv_heads
    dk = dk.unflatten(-2, (problem.kv_heads, group)).sum(-2).to(k.dtype)
    dv = dv.unflatten(-2, (problem.kv_heads, group)).sum(-2).to(v.dtype)
    return dk, dv


def forward(problem, inputs, config=None):
    launch = plan(problem)
    if is_long(launch):
        return window_long_launch.forward(problem, inputs, config)
    q, k, v, rpb = (_unit_channels(t) for t in (inputs.query, inputs.key, inputs.value, inputs.rpb))
    out = q.new_empty(*q.shape[:-1], problem.value_dim)
    lse = torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)
    bias = dense_bias(rpb, launch, problem) if rpb is not None else lse  # unused pointer when no rpb
    key = (problem, launch, config_key(config), *launch_key(q, k, v, rpb))
    _, run = cached(_FORWARD_PLANS, key, lambda: (config, _forward_launch(launch, problem, config, q, k, v, out, lse, bias)))
    run(q, k, v, out, lse, bias)
    return out, lse


# Launches per (problem, config, input layouts): a call whose key is known skips the argument
# computation and Triton's binder (fast_launch). Each entry keeps its config alive.
_FORWARD_PLANS = plan_cache()
_BACKWARD_PLANS = plan_cache()


def launch_key(*tensors) -> tuple:
    """The part of a launch plan's key that comes from the call's tensors and switches."""
    return (*(tensor_layout(t) for t in tensors), torch.backends.cuda.matmul.allow_tf32, interpreting())


def _forward_launch(launch: WindowLaunch, problem, config, q, k, v, out, lse, bias) -> Launch:
    _check_int32(q, k, v)
    rank = problem.rank
    cfg = _launch_config("forward", launch, problem, q.device, config, 1, q.element_size())
    align = _row_alignment(rank, q, k, v, out)
    return Launch(window_forward_kernel, (_programs(launch, problem, cfg["windows_per_program"]),), [
        q, k, v, out, lse, bias,
        *_strides(q, rank, align), *_strides(k, rank, align), *_strides(v, rank, align),
        *_strides(out, rank, align), *_strides(lse.unsqueeze(-1), rank),
        *_grid_args(launch, problem), cfg["windows_per_program"],
        problem.heads, problem.heads // problem.kv_heads, problem.scale, problem.softcap or 1.0,
    ], dict(
        HAS_BIAS=bias is not lse, ALIGN=align, NUM_STAGES=cfg["num_stages"], RANK=rank, **_dilated_axes(launch),
        RELOAD_BIAS=cfg.get("reload_bias", False), **_compile_options(cfg),
        **_meta(launch, problem, q.dtype),
    ))


def backward(problem, inputs, out, lse, grad_out, grad_lse, needs_grad, config=None):
    launch = plan(problem)
    if is_long(launch):
        return window_long_launch.backward(problem, inputs, out, lse, grad_out, grad_lse, needs_grad, config)
    q, k, v, rpb = (_unit_channels(t) for t in (inputs.query, inputs.key, inputs.value, inputs.rpb))
    out, grad_out = _unit_channels(out), _unit_channels(grad_out)
    dq = torch.empty_like(q)
    dk, dv = key_value_grad_buffers(problem, q, k, v)
    bias_grad = rpb is not None and bool(needs_grad[3])
    if grad_lse is not None:
        grad_lse = grad_lse.contiguous()
    lse = lse.contiguous()
    key = (problem, launch, config_key(config), bias_grad, *launch_key(q, k, v, rpb, out, lse, grad_out, grad_lse, dq, dk, dv))
    _, programs, run = cached(_BACKWARD_PLANS, key, lambda: (config, *_backward_launch(
        launch, problem, config, bias_grad, q, k, v, out, lse, grad_out, grad_lse, dq, dk, dv)))
    dbias = (
        torch.empty(programs, launch.block, launch.block, dtype=torch.float32, device=q.device)
        if bias_grad else lse
    )
    bias = dense_bias(rpb, launch, problem) if rpb is not None else lse
    run(q, k, v, out, lse, grad_out, grad_lse if grad_lse is not None else lse, bias, dq, dk, dv, dbias)
    dk, dv = sum_query_head_groups(problem, dk, dv, k, v)
    drpb: Optional[torch.Tensor] = None
    if bias_grad:
        per_head = dbias.view(-1, problem.heads, launch.block, launch.block).sum(0)
        drpb = table_gradient(per_head, rpb, launch)
    grads = [dq, dk, dv, drpb, None, None, None]
    return [g if need else None for g, need in zip(grads, needs_grad)]


def _backward_launch(launch: WindowLaunch, problem, config, bias_grad, q, k, v, out, lse, grad_out, grad_lse,
                     dq, dk, dv) -> Tuple[int, Launch]:
    """(programs, launch) of the backward kernel; the tensor places the call fills (bias, dbias,
    grad_lse where absent) hold ``lse`` while the launch is built."""
    rank = problem.rank
    cfg = _launch_config("backward", launch, problem, q.device, config, 1, q.element_size())
    programs = _programs(launch, problem, cfg["windows_per_program"])
    align = _row_alignment(rank, q, k, v, out, grad_out, dq, dk, dv)
    return programs, Launch(window_backward_kernel, (programs,), [
        q, k, v, out, lse, grad_out, lse, lse, dq, dk, dv, lse,
        *_strides(q, rank, align), *_strides(k, rank, align), *_strides(v, rank, align),
        *_strides(out, rank, align), *_strides(lse.unsqueeze(-1), rank),
        *_strides(grad_out, rank, align), *_strides(dq, rank, align),
        *_strides(dk, rank, align), *_strides(dv, rank, align),
        *_grid_args(launch, problem), cfg["windows_per_program"],
        problem.heads, problem.heads // problem.kv_heads, problem.scale, problem.softcap or 1.0,
    ], dict(
        HAS_BIAS=problem.has_rpb, BIAS_GRAD=bias_grad, HAS_GLSE=grad_lse is not None,
        ALIGN=align, NUM_STAGES=cfg["num_stages"], RANK=rank, **_dilated_axes(launch), **_compile_options(cfg),
        **_meta(launch, problem, q.dtype),
    ))


from . import window_long_launch  # noqa: E402  (it imports this module: after the definitions it uses)
