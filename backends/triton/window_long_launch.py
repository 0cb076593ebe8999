"""Host side of the long-window kernels (window_long_kernels.py): windows whose padded volume
exceeds window_launch.SQUARE_TILE_MAX. Reuses window_launch's problem plan (rank-3 axes, window
enumeration), strides, alignment, int32 checks and rpb-table gather/fold; adds the part split,
the launch settings of these kernels and the backward's scratch (delta, dQ accumulator, rpb-gradient
partials)."""

from __future__ import annotations

import functools
import math
from typing import NamedTuple, Optional, Tuple

import torch

from . import window_launch as wl
from .fast_launch import Launch, cached, config_key, plan_cache
from .window_long_kernels import window_long_dkdv_kernel, window_long_dq_kernel, window_long_forward_kernel

# Largest part (query or key slots of one score block) where the window allows: 64 x 64 float32
# blocks are 16 registers a thread at 8 warps; with 128-slot parts the forward needed ~250 registers
# without rpb (sm_90, Swin-B 384) against ~180 with 64. A window that would need more than MAX_PARTS
# parts (225-240 tokens: 64 + 64 + 64 + 32 + 16) is padded to 4 x 64 instead: a 128-slot part there
# spilled 40 KB a thread and its float32 dK/dV kernel needed 512 KiB of shared memory (sm_90
# compile report, 15x15, head_dim 128).
MAX_PART = 64
# tl.dot's smallest tile side, and so the granularity of the window volume's split.
MIN_PART = 16
# The smallest part of float32 problems. With 16-slot parts (64-byte float32 rows) Triton 3.6
# compiles the dQ kernel's tf32 products into shared-memory reads past their buffers on Hopper
# (illegal addresses on random GPU tests, 2-D windows of 143 and 203 tokens: RESULTS.md, 2026-11-26).
MIN_PART_FLOAT32 = 32
MAX_PARTS = 4  # the kernels take P0..P3


def _split(padded: int, max_part: int):
    sizes = []
    while padded:
        size = min(max_part, 1 << (padded.bit_length() - 1))
        sizes.append(size)
        padded -= size
    return sizes


@functools.lru_cache(maxsize=64)
def parts(volume: int, max_part: Optional[int] = None, min_part: int = MIN_PART) -> Tuple[int, int, int, int]:
    """``(P0, P1, P2, P3)``: the window volume rounded up to a multiple of ``min_part``, cut into
    power-of-two parts of at most ``max_part`` (default MAX_PART) slots, largest first; 0 = absent.
    Powers of two because Triton tiles must be; largest first so that the parts are few. Where that
    takes more than MAX_PARTS parts the volume is rounded up to a multiple of ``max_part`` (at most
    ``max_part - min_part`` idle slots, always inside the last part), and only if that still takes
    too many does ``max_part`` double."""
    max_part = MAX_PART if max_part is None else max_part
    if volume < 1:
        raise ValueError(f"volume must be at least 1 token, got {volume}")
    if max_part < min_part or max_part & (max_part - 1):
        raise ValueError(f"max_part must be a power of two of at least {min_part}, got {max_part}")
    padded = -(-volume // min_part) * min_part
    sizes = _split(padded, max_part)
    if len(sizes) > MAX_PARTS:
        sizes = _split(-(-padded // max_part) * max_part, max_part)
    while len(sizes) > MAX_PARTS:
        max_part *= 2
        sizes = _split(padded, max_part)
    return tuple(sizes) + (0,) * (MAX_PARTS - len(sizes))


# Launch settings (config keys ``forward_*`` and ``backward_*`` as for the short kernels; the
# backward's apply to both its kernels). Pipeline depth 2 (one window's loads in flight during this
# window's math) where the stage buffers (every load of one window) fit in STAGE_BYTES, else 1.
# Warps (sm_90 compile reports, Swin-B 384 float16): the forward's 64-row parts are one warpgroup
# (wgmma's M = 64), so 4 warps; 8 would duplicate its tiles and ran at the same 255 registers. The
# backward kernels hold more tiles at once (P, dP, dS, the rpb-gradient block, dK/dV): 8 warps
# halve each one's share (dQ kernel 384 B spilled against 1 KB at 4 warps, dK/dV none against 168 B).
DEFAULTS = {
    "forward": dict(num_stages=2, num_warps=4),
    "dq": dict(num_stages=2, num_warps=8),
    "dkdv": dict(num_stages=2, num_warps=8),
}
STAGE_BYTES = 96 * 1024


def _stage_bytes(kind: str, block_d: int, block_dv: int, p: Tuple[int, ...], element_size: int) -> int:
    """Bytes one window's pipelined loads take (the largest part's program: it dominates)."""
    volume, largest = sum(p), max(p)
    if kind == "forward":  # q part, every key part's k and v
        return (largest * block_d + volume * (block_d + block_dv)) * element_size
    if kind == "dq":  # q, dO, O part; one key part's k, v; float32 dQ accumulator
        return (largest * (block_d + 2 * block_dv) + largest * (block_d + block_dv)) * element_size + largest * block_d * 4
    return (largest * (block_d + block_dv) + volume * (block_d + block_dv)) * element_size  # dkdv: k, v; q, dO


def launch_config(kind: str, launch, problem, p, device, config, element_size: int) -> dict:
    """windows_per_program, num_stages, num_warps of one long kernel: the config's entries where
    given (``forward_...`` for the forward, ``backward_...`` for both backward kernels)."""
    config = config or {}
    prefix = "forward" if kind == "forward" else "backward"
    chosen = dict(DEFAULTS[kind])
    if chosen["num_stages"] * _stage_bytes(kind, launch.block_d, launch.block_dv, p, element_size) > STAGE_BYTES:
        chosen["num_stages"] = 1
    chosen["windows_per_program"] = wl._windows_per_program(launch, problem, device, _part_count(p))
    for key in ("windows_per_program", "num_stages", "num_warps"):
        chosen[key] = int(config.get(f"{prefix}_{key}", chosen[key]))
    if config.get(f"{prefix}_maxnreg"):
        chosen["maxnreg"] = int(config[f"{prefix}_maxnreg"])
    return chosen


def _part_meta(p) -> dict:
    return dict(P0=p[0], P1=p[1], P2=p[2], P3=p[3])


def _meta(launch, problem, dtype) -> dict:
    """Constexprs shared with the short kernels, less their tile size (BLOCK)."""
    meta = wl._meta(launch, problem, dtype)
    del meta["BLOCK"]
    return meta


def _problem_parts(problem) -> Tuple[int, int, int, int]:
    # Never above the largest part (MAX_PART may be set as low as MIN_PART).
    smallest = min(MIN_PART_FLOAT32, MAX_PART) if problem.dtype == torch.float32 else MIN_PART
    return parts(math.prod(problem.window), min_part=smallest)


def _part_count(p) -> int:
    return sum(1 for size in p if size)


def _programs(launch, problem, windows_per_program: int, p) -> int:
    return wl._programs(launch, problem, windows_per_program, _part_count(p))


def dense_bias(rpb: torch.Tensor, launch, problem, padded_volume: int) -> torch.Tensor:
    """``[H, VP, VP]`` bias tile (window_launch.dense_bias with the padded volume as the tile)."""
    return wl.dense_bias(rpb, launch._replace(block=padded_volume), problem)


def forward(problem, inputs, config=None):
    q, k, v, rpb = (wl._unit_channels(t) for t in (inputs.query, inputs.key, inputs.value, inputs.rpb))
    launch = wl.plan(problem)
    p = _problem_parts(problem)
    out = q.new_empty(*q.shape[:-1], problem.value_dim)
    lse = torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)
    bias = dense_bias(rpb, launch, problem, sum(p)) if rpb is not None else lse  # unused pointer when no rpb
    key = (problem, launch, p, config_key(config), *wl.launch_key(q, k, v, rpb))
    _, run = cached(_FORWARD_PLANS, key, lambda: (config, _forward_launch(launch, p, problem, config, q, k, v, out, lse, bias)))
    run(q, k, v, out, lse, bias)
    return out, lse


# Launch plans, as in window_launch.
_FORWARD_PLANS = plan_cache()
_BACKWARD_PLANS = plan_cache()


def _forward_launch(launch, p, problem, config, q, k, v, out, lse, bias) -> Launch:
    wl._check_int32(q, k, v)
    rank = problem.rank
    cfg = launch_config("forward", launch, problem, p, q.device, config, q.element_size())
    align = wl._row_alignment(rank, q, k, v, out)
    return Launch(window_long_forward_kernel, (_programs(launch, problem, cfg["windows_per_program"], p),), [
        q, k, v, out, lse, bias,
        *wl._strides(q, rank, align), *wl._strides(k, rank, align), *wl._strides(v, rank, align),
        *wl._strides(out, rank, align), *wl._strides(lse.unsqueeze(-1), rank),
        *wl._grid_args(launch, problem), cfg["windows_per_program"],
        problem.heads, problem.heads // problem.kv_heads, problem.scale, problem.softcap or 1.0, 0,
    ], dict(
        HAS_BIAS=bias is not lse, ALIGN=align, NUM_STAGES=cfg["num_stages"], RANK=rank, **wl._dilated_axes(launch),
        **_part_meta(p), **wl._compile_options(cfg), **_meta(launch, problem, q.dtype),
    ))


class _BackwardPlan(NamedTuple):
    config: object  # kept alive: its id is in the key
    dq_runs: int  # programs' window runs of the dQ kernel (the rows of its rpb-gradient partials)
    dq: Launch
    dkdv: Launch


def backward(problem, inputs, out, lse, grad_out, grad_lse, needs_grad, config=None):
    q, k, v, rpb = (wl._unit_channels(t) for t in (inputs.query, inputs.key, inputs.value, inputs.rpb))
    out, grad_out = wl._unit_channels(out), wl._unit_channels(grad_out)
    launch = wl.plan(problem)
    p = _problem_parts(problem)
    dq = torch.empty_like(q)
    dk, dv = wl.key_value_grad_buffers(problem, q, k, v)
    lse = lse.contiguous()
    grad_lse = grad_lse.contiguous() if grad_lse is not None else None
    # delta = rowsum(O * dO) - grad_lse, written by the dQ kernel's first key part, read by the
    # later key parts and the dK/dV kernel: LSE's layout, so both use LSE's strides.
    delta = torch.empty_like(lse)
    # dQ crosses key parts in float32 (the program's own rows); one key part needs no scratch.
    scratch = (torch.empty(*q.shape[:-1], launch.block_d, dtype=torch.float32, device=q.device)
               if p[1] else lse.unsqueeze(-1))
    bias_grad = rpb is not None and bool(needs_grad[3])
    bias = dense_bias(rpb, launch, problem, sum(p)) if rpb is not None else lse
    key = (problem, launch, p, config_key(config), bias_grad,
           *wl.launch_key(q, k, v, rpb, out, lse, grad_out, grad_lse, dq, dk, dv))
    plan = cached(_BACKWARD_PLANS, key, lambda: _backward_launches(
        launch, p, problem, config, bias_grad, q, k, v, out, lse, grad_out, grad_lse, dq, dk, dv, scratch))
    dbias = (torch.empty(plan.dq_runs, problem.heads, sum(p), sum(p), dtype=torch.float32, device=q.device)
             if bias_grad else lse)
    plan.dq(q, k, v, out, lse, grad_out, grad_lse if grad_lse is not None else lse, bias, dq, delta, scratch, dbias)
    plan.dkdv(q, k, v, lse, grad_out, delta, bias, dk, dv)
    dk, dv = wl.sum_query_head_groups(problem, dk, dv, k, v)
    drpb: Optional[torch.Tensor] = None
    if bias_grad:
        drpb = wl.table_gradient(dbias.sum(0), rpb, launch._replace(block=sum(p)))
    grads = [dq, dk, dv, drpb, None, None, None]
    return [g if need else None for g, need in zip(grads, needs_grad)]


def _backward_launches(launch, p, problem, config, bias_grad, q, k, v, out, lse, grad_out, grad_lse, dq, dk, dv,
                       scratch) -> _BackwardPlan:
    """The dQ and dK/dV launches; the tensor places the call fills (bias, delta, dbias, grad_lse
    where absent) hold ``lse`` while they are built."""
    rank = problem.rank
    align = wl._row_alignment(rank, q, k, v, out, grad_out, dq, dk, dv)
    common = (*wl._grid_args(launch, problem),)
    heads_args = (problem.heads, problem.heads // problem.kv_heads, problem.scale, problem.softcap or 1.0, 0)
    flags = dict(HAS_BIAS=problem.has_rpb, ALIGN=align, RANK=rank,
                 **wl._dilated_axes(launch), **_part_meta(p), **_meta(launch, problem, q.dtype))

    cfg = launch_config("dq", launch, problem, p, q.device, config, q.element_size())
    dq_launch = Launch(window_long_dq_kernel, (_programs(launch, problem, cfg["windows_per_program"], p),), [
        q, k, v, out, lse, grad_out, lse, lse, dq, lse, scratch, lse,
        *wl._strides(q, rank, align), *wl._strides(k, rank, align), *wl._strides(v, rank, align),
        *wl._strides(out, rank, align), *wl._strides(lse.unsqueeze(-1), rank),
        *wl._strides(grad_out, rank, align), *wl._strides(dq, rank, align), *wl._strides(scratch, rank),
        *common, cfg["windows_per_program"], *heads_args,
    ], dict(
        BIAS_GRAD=bias_grad, HAS_GLSE=grad_lse is not None, NUM_STAGES=cfg["num_stages"],
        **wl._compile_options(cfg), **flags,
    ))
    dq_runs = -(-launch.num_windows // cfg["windows_per_program"])
    cfg = launch_config("dkdv", launch, problem, p, q.device, config, q.element_size())
    dkdv_launch = Launch(window_long_dkdv_kernel, (_programs(launch, problem, cfg["windows_per_program"], p),), [
        q, k, v, lse, grad_out, lse, lse, dk, dv,
        *wl._strides(q, rank, align), *wl._strides(k, rank, align), *wl._strides(v, rank, align),
        *wl._strides(lse.unsqueeze(-1), rank), *wl._strides(grad_out, rank, align),
        *wl._strides(dk, rank, align), *wl._strides(dv, rank, align),
        *common, cfg["windows_per_program"], *heads_args,
    ], dict(NUM_STAGES=cfg["num_stages"], **wl._compile_options(cfg), **flags))
    return _BackwardPlan(config, dq_runs, dq_launch, dkdv_launch)
