"""Host side of the Triton neighbourhood backend: strides, grids and kernel launches.

Problems of rank 1 and 2 run as rank 3 with leading axes of length 1 (window 1, stride 0), so
the kernels have one shape. Only tile sizes, causal flags, the pattern and feature flags are
compile-time constants; lengths, windows, strides and dilations are runtime ints, so new grids or
batch sizes do not recompile.
"""

from __future__ import annotations

import functools
import math
import os
from typing import List, Optional, Tuple

import torch
from triton.runtime.errors import OutOfResources

from haloattn.backend import AttentionInputs
from haloattn.geometry import key_range
from haloattn.problem import Problem

from . import batch_slices, tiles
from .descriptor_scratch import ensure_allocator
from .device_limits import has_copy_engine
from .relative_fold import fold_into_table, slots_of_entries
from .plugin import interpreting
from .fast_launch import Launch, cached, config_key, plan_cache, tensor_layout
from .backward_kernels import dkdv_kernel, dq_kernel, extra_dkdv_kernel, row_stats_kernel
from .forward_kernel import forward_kernel
from .live_steps import live_steps
from .host_descriptors import host_descriptors_fit, token_descriptors

INT32_LIMIT = 2**31 - 1


def _pad3(values, fill) -> list:
    values = list(values)
    return [fill] * (3 - len(values)) + values


def token_strides(t: torch.Tensor, rank: int) -> list:
    """(batch, axis0, axis1, axis2, head) strides of a [B, *spatial, H(, D)] tensor, rank 3."""
    s = t.stride()
    return [s[0]] + _pad3(s[1:1 + rank], 0) + [s[1 + rank]]


def _unit_last(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    # Kernels vectorise over the head dim; any other layout is read through strides.
    if t is None or t.stride(-1) == 1:
        return t
    return t.contiguous()


def _span(t: Optional[torch.Tensor]) -> int:
    if t is None:
        return 0
    return 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()) if n > 0)


def needs_int64(*tensors) -> bool:
    return max(_span(t) for t in tensors) > INT32_LIMIT


# float32 products where TF32 is not allowed: "tf32x3" (each operand split into a TF32 high and
# low part, three tensor-core products, float32 accumulation: error ~1e-6, inside SEMANTICS.md's
# float32 tolerance of 1e-5, as triton_window multiplies) or "ieee" (CUDA-core FMAs: forwards
# 1.5-2.5x and backwards 2.7-4.5x slower on an H200, RESULTS.md "Off-list shapes").
FLOAT32_PRODUCTS_ENV = "HALOATTN_TRITON_FLOAT32"


def _precision(dtype: torch.dtype) -> str:
    """tl.dot's input_precision for inputs of ``dtype`` (16-bit products are exact either way)."""
    if interpreting():
        return "interpret"
    if dtype == torch.float32 and not torch.backends.cuda.matmul.allow_tf32:
        choice = os.environ.get(FLOAT32_PRODUCTS_ENV, "tf32x3")
        if choice not in ("tf32x3", "ieee"):
            raise ValueError(f"{FLOAT32_PRODUCTS_ENV}={choice!r}: expected 'tf32x3' (the default) or 'ieee'")
        return choice
    return "tf32"


def exact_float32_products(precision: str) -> bool:
    """Whether products of this precision carry float32's accuracy from float32 operands (CUDA
    cores, or three TF32 products): their register-heavy tiles take tiles.default_config's
    own forward and backward tiles (EXACT_FLOAT32_FORWARD_TILES, EXACT_FLOAT32_BACKWARD)."""
    return precision in ("ieee", "tf32x3")


def use_descriptors(wanted: bool, large: bool, *tensors: torch.Tensor) -> bool:
    """Whether K/V tiles can come through tensor descriptors (TMA): asked for by the config, a
    Hopper-or-newer GPU (or the interpreter), 16-bit data, int32 coordinates, and every batch,
    token and head stride a multiple of 16 bytes, as the copy engine requires, and none of them 0:
    an expanded tensor is read by pointer (the driver's map encoder refuses zero strides, which
    csrc/tensor_maps.h works around; the descriptors built here on the device would take them
    unchecked, and no GPU run has shown what the copy engine then reads)."""
    if not wanted or large:
        return False
    first = tensors[0]
    if first.dtype not in (torch.float16, torch.bfloat16):
        return False
    if not interpreting() and not has_copy_engine(first.device):
        return False
    for t in tensors:
        if t.data_ptr() % 16 or any(s == 0 or (s * t.element_size()) % 16 for s in t.stride()[:-1]):
            return False
    if not interpreting():
        ensure_allocator()
    return True


def use_reduce_descriptors(large: bool, dq_sum: Optional[torch.Tensor]) -> bool:
    """Whether the atomic-dQ pass can add whole query tiles to the float32 dQ sum as bulk
    reductions: Hopper or newer (Triton 3.6's interpreter has no descriptor reductions: there the
    element-wise atomics run), int32 coordinates, 16-byte strides."""
    if dq_sum is None or large or interpreting() or not has_copy_engine(dq_sum.device):
        return False
    if dq_sum.data_ptr() % 16 or any((s * dq_sum.element_size()) % 16 for s in dq_sum.stride()[:-1]):
        return False
    ensure_allocator()
    return True


def cdiv(a: int, b: int) -> int:
    # Not triton.cdiv: from Python that is a JIT function call costing ~8 us on the host, and
    # a launch computes several of these.
    return -(-a // b)


def _block(dim: int) -> int:
    return max(16, tiles.pow2_ceil(dim))


@functools.lru_cache(maxsize=256)
def geometry(problem: Problem) -> "Geometry":
    """The problem's Geometry, built once per problem (host time per call)."""
    return Geometry(problem)


class Geometry:
    """The per-axis runtime arguments shared by every kernel, padded to rank 3."""

    def __init__(self, problem: Problem):
        axes = problem.axes
        self.L = _pad3([a.length for a in axes], 1)
        self.K = _pad3([a.window for a in axes], 1)
        self.S = _pad3([a.stride for a in axes], 1)
        self.Dl = _pad3([a.dilation for a in axes], 1)
        self.shift = _pad3([a.shift for a in axes], 0)
        self.causal = _pad3([a.causal for a in axes], False)
        self.window = problem.pattern == "window"

    def tiles_per_group(self, tile: List[int]) -> List[int]:
        return [cdiv(cdiv(L, d), t) for L, d, t in zip(self.L, self.Dl, _pad3(tile, 1))]

    def grid0(self, tile: List[int]) -> int:
        return math.prod(d * n for d, n in zip(self.Dl, self.tiles_per_group(tile)))

    def runtime_args(self, tile: List[int]) -> list:
        return [*self.L, *self.K, *self.S, *self.Dl, *self.shift, *self.tiles_per_group(tile)]

    def constexprs(self) -> dict:
        return dict(C0=self.causal[0], C1=self.causal[1], C2=self.causal[2], WINDOW=self.window)


def _tile_constexprs(q: List[int], kv: List[int], rank: int) -> dict:
    q3, kv3 = _pad3(q, 1), _pad3(kv, 1)
    return dict(TM0=q3[0], TM1=q3[1], TM2=q3[2], TN0=kv3[0], TN1=kv3[1], TN2=kv3[2])


def _walk_constexprs(cfg: dict) -> dict:
    """How a kernel walks its streamed tiles (anchored at the common range or not, masks per
    crossed axis or one for all); ``tiles.normalise`` fills both in."""
    return dict(ANCHOR=cfg["anchor"], AXIS_MASKS=cfg["axis_masks"])


def _rpb_strides(rpb: Optional[torch.Tensor], rank: int) -> list:
    if rpb is None:
        return [0, 0, 0, 0]
    s = rpb.stride()
    return [s[0]] + _pad3(s[1:], 0)


def _extra_strides(t: Optional[torch.Tensor]) -> list:
    if t is None:
        return [0, 0, 0]
    return [t.stride(0), t.stride(1), t.stride(2)]


def fused_mods(problem: Problem):
    """The problem's score_mod / mask_mod compiled for the kernels (mod_codegen, checked once per
    problem), or None without mods."""
    if problem.score_mod is None and problem.mask_mod is None:
        return None
    from .mod_check import checked_mods

    return checked_mods(problem)


def mod_tensors(mods, filler: torch.Tensor) -> list:
    """The tensors the mods read (the kernels' MOD_T0..MOD_T3), ``filler`` where there are none."""
    return mods.tensor_args(filler) if mods is not None else [filler] * 4


def mod_constexprs(problem: Problem, mods, large: bool, gradient: bool = False) -> dict:
    """The kernels' mod constexprs. Flat indices are int64 where the problem is addressed in int64
    or where a product of two of them could pass int32 (PyTorch hands the mods int64 indices)."""
    flags = dict(HAS_SCORE_MOD=mods is not None and mods.has_score, HAS_MASK_MOD=mods is not None and mods.has_mask,
                 SCORE_MOD=mods.score if mods is not None else None, MASK_MOD=mods.mask if mods is not None else None,
                 WIDE_INDEX=large or (problem.tokens + problem.extra_tokens) ** 2 > INT32_LIMIT)
    if gradient:
        flags["SCORE_MOD_GRAD"] = mods.score_grad if mods is not None else None
    return flags


def forward(problem: Problem, inputs: AttentionInputs, config=None) -> Tuple[torch.Tensor, torch.Tensor]:
    if batch_slices.needs_slices(problem):
        return batch_slices.forward_in_slices(forward, problem, inputs, config)
    q, k, v = (_unit_last(t) for t in inputs[:3])
    ak, av = _unit_last(inputs.additional_keys), _unit_last(inputs.additional_values)
    rpb = inputs.rpb
    out = torch.empty(*q.shape[:-1], problem.value_dim, dtype=q.dtype, device=q.device)
    lse = torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)
    precision = _precision(q.dtype)
    config = config or tiles.default_config(problem, exact_float32=exact_float32_products(precision))
    key = (problem, config_key(config), tensor_layout(q), tensor_layout(k), tensor_layout(v),
           tensor_layout(rpb), tensor_layout(ak), tensor_layout(av), precision)
    gluon = cached(_GLUON_PLANS, key, lambda: _gluon_plan(problem, config, q, k, v, out, lse))
    if gluon is not TRITON_FORWARD:
        gluon(q, k, v, out, lse)
        return out, lse
    mods = fused_mods(problem)
    tensors = (q, k, v, out, lse, rpb if rpb is not None else q, ak if ak is not None else q, av if av is not None else q,
               *mod_tensors(mods, q))
    _run_fitted(_FORWARD_PLANS, key, problem, config,
                lambda cfg: _forward_launch(problem, cfg, q, k, v, out, lse, rpb, ak, av, mods),
                lambda plan: _start(plan.launch, *tensors, plan.live_lists(tensors[-4:], q)))
    return out, lse


# A Gluon plan cache entry for calls that run the Triton forward (a cached None would rebuild).
TRITON_FORWARD = "triton forward"
_GLUON_PLANS = plan_cache()


def _gluon_plan(problem: Problem, config, q, k, v, out, lse):
    """The Gluon forward's launch where the config names it and the call suits it
    (gluon_forward_launch), else TRITON_FORWARD."""
    from . import gluon_forward_launch  # (here: it takes this module's helpers)

    fwd = tiles.normalise(config, problem)["fwd"]
    return gluon_forward_launch.plan(problem, fwd, q, k, v, out, lse) or TRITON_FORWARD


class LivePlan:
    """A kernel's launch and the plan of its live-step lists (live_steps.LiveSteps; None without a
    mask_mod, when the kernel walks every step)."""

    __slots__ = ("launch", "live")

    def __init__(self, launch: Launch, live):
        self.launch, self.live = launch, live

    def live_lists(self, mod_tensors, filler: torch.Tensor) -> torch.Tensor:
        """The lists for this call (made from the mask's tensors as they are now), or ``filler``."""
        return self.live.compute(mod_tensors) if self.live is not None else filler


def _live_arguments(live) -> dict:
    """The kernels' LIVE_STEPS constexpr and list strides."""
    strides = live.strides if live is not None else (0, 0, 0)
    return dict(zip(("slive_b", "slive_h", "slive_t"), strides), LIVE_STEPS=live is not None)


# Kernels whose tiles the config sets, by the config part that sets them.
CONFIG_PART = {"forward_kernel": "fwd", "dq_kernel": "dq", "dkdv_kernel": "dkdv", "jvp_kernel": "dq"}
# How many times a plan is refitted after a kernel compiled too large for the GPU's shared memory.
MAX_REFITS = 4


class _KernelTooLarge(Exception):
    """A kernel that compiled to more shared memory than the GPU has, and the config part that
    sets its tiles."""

    def __init__(self, part: str, overshoot: int):
        super().__init__(part, overshoot)
        self.part, self.overshoot = part, overshoot


def _start(launch: Launch, *tensors) -> None:
    """Run ``launch``; a configured kernel that Triton refuses for its shared memory becomes
    _KernelTooLarge (which kernel, by how much), for _run_fitted to refit."""
    try:
        launch(*tensors)
    except OutOfResources as err:
        part = CONFIG_PART.get(launch.kernel.__name__)
        if part is None or err.name != "shared memory":
            raise
        raise _KernelTooLarge(part, err.required - err.limit) from err


def _run_fitted(plans, key, problem: Problem, config, build, run, before_retry=None):
    """Run the plan cached under ``key`` (built from ``config`` on a miss). Tiles come from an
    estimate of shared memory (tiles._shared_bytes) that leaves out what the compiler adds; where
    a kernel then compiles too large for the GPU (Triton refuses its first launch), its tiles are
    refitted to the overshoot (tiles.shrink_to_fit) and the plan rebuilt and run again, and the
    refitted plan stays under ``key``. ``before_retry`` resets outputs that a partial run may
    have added to."""
    plan = cached(plans, key, lambda: (config, config, build(config)))
    for attempt in range(MAX_REFITS + 1):
        try:
            return run(plan[2])
        except _KernelTooLarge as too_large:
            if attempt == MAX_REFITS:
                raise too_large.__cause__
            fitted = tiles.shrink_to_fit(problem, tiles.normalise(plan[1], problem), too_large.part,
                                         too_large.overshoot)
            plan = plans[key] = (config, fitted, build(fitted))
            if before_retry is not None:
                before_retry()


# Launches per (problem, config, input layouts): a call whose key is known skips the argument
# computation and Triton's binder (fast_launch). Each entry keeps its config alive; a call
# without one is keyed by the default config's dict (cached per problem), not by None, so that
# a changed default takes effect.
_FORWARD_PLANS = plan_cache()


def _forward_launch(problem, config, q, k, v, out, lse, rpb, ak, av, mods) -> LivePlan:
    cfg = tiles.normalise(config, problem)["fwd"]
    H, B, r = problem.heads, problem.batch, problem.rank
    geo = geometry(problem)
    large = needs_int64(q, k, v, out)
    precision = _precision(q.dtype)
    with_mods = mod_constexprs(problem, mods, large)
    live = live_steps(problem, mods, geo, cfg, False, with_mods["WIDE_INDEX"], _tile_constexprs(cfg["q"], cfg["kv"], r),
                      q.device)
    # Packed programs share one walk between pairs; a list of live steps is a pair's own.
    pack = cfg.get("pack", 1) if live is None else 1
    heads = head_block_constexprs(problem, cfg, precision)
    tma = use_descriptors(cfg.get("tma", False), large, k, v)
    host = tma and _host_descriptors_fit(r, geo, heads, k, v)
    # A packed program moves between (batch, head) pairs, which a host descriptor's coordinates
    # name; one built on the device describes one pair's tokens, so packed programs without host
    # descriptors read by pointer.
    tma = tma and (host or pack == 1)
    kv_descs = _host_kv_descriptors(k, v, r, cfg["kv"], heads) if host else (None,) * 4
    q_box, o_box, *box_descs = _query_boxes(r, geo, heads, cfg["q"], q, out) if host else (False, False, None, None)
    grid0 = geo.grid0(cfg["q"])
    # Packed programs run `pack` (batch, head) pairs of one query tile each, on a flat grid.
    grid = (grid0, H, B) if pack == 1 else (grid0 * cdiv(B * H, pack), 1, 1)
    return LivePlan(Launch(forward_kernel, grid, [
        q, k, v, out, lse, rpb if rpb is not None else q, ak if ak is not None else q, av if av is not None else q,
        *mod_tensors(mods, q), q, *kv_descs, *box_descs, *token_strides(q, r), *token_strides(k, r),
        *token_strides(v, r), *token_strides(out, r), *token_strides(lse.unsqueeze(-1), r), *_rpb_strides(rpb, r),
        *_extra_strides(ak), *_extra_strides(av), H // problem.kv_heads, problem.extra_tokens, problem.head_dim,
        problem.value_dim, H, B, *geo.runtime_args(cfg["q"]),
        problem.scale, problem.softcap or 1.0,
    ], dict(
        **geo.constexprs(), **_tile_constexprs(cfg["q"], cfg["kv"], r), **heads,
        HAS_RPB=rpb is not None, HAS_SOFTCAP=problem.softcap is not None, HAS_EXTRA=ak is not None,
        LARGE=large, PRECISION=precision, RANK=r, TMA=tma and not host, HOST_TMA=host, Q_BOX=q_box, O_BOX=o_box,
        LAZY_RESCALE=cfg.get("lazy_rescale", False),
        FOLD_SCALE=(cfg.get("fold_scale", True) and problem.scale > 0 and rpb is None and problem.softcap is None
                    and problem.score_mod is None),
        # (the interpreter, which runs the CPU tests, has no inline PTX: every exp2 there is exact)
        EXP2_EVERY=cfg.get("exp2_split", 0) if q.device.type != "cpu" else 0,
        PACK=pack, **_walk_constexprs(cfg), **with_mods, **_live_arguments(live),
        num_warps=cfg["warps"], num_stages=cfg["stages"],
    ), FORWARD_DESCRIPTOR_BASES), live)


# The kernels' host-built descriptor arguments and the tensor arguments they describe.
KV_DESCRIPTOR_BASES = {"KH": "K", "VH": "V", "KTH": "K", "VTH": "V"}
QUERY_DESCRIPTOR_BASES = {"QH": "Q", "DOH": "DO", "QTH": "Q", "DOTH": "DO", "STH": "STATS"}
FORWARD_DESCRIPTOR_BASES = {**KV_DESCRIPTOR_BASES, "QBOX": "Q", "OBOX": "O"}
# Whether a forward that streams K/V through host descriptors also reads its query tile
# ("query") and writes its output ("output") through host descriptors of query-tile boxes: one
# copy instead of a pointer gather or scatter (heads without a channel tail only). Both off
# (RESULTS.md, "Query-tile boxes: the output alone, and why the query box goes wrong"): the
# output box alone is right but 0.98-1.01x; the query box makes the query tile a register
# operand of wgmma, whose registers ptxas (12.8 and 13.0) hands to the probabilities inside the
# key loop at 64 channels, so every step after the first multiplies the wrong queries.
HOST_QUERY_BOXES = {"query": False, "output": False}


def _host_descriptors_fit(rank: int, geo: "Geometry", heads: dict, keyed: torch.Tensor,
                          valued: torch.Tensor) -> bool:
    """Whether a kernel's two streamed tensors, one read in head-dim blocks (K, or Q) and one in
    value-dim blocks (V, or dO), can both come through host-built descriptors."""
    return (host_descriptors_fit(rank, geo.Dl, keyed, heads["BLOCK_D"], heads["TAIL_D"])
            and host_descriptors_fit(rank, geo.Dl, valued, heads["BLOCK_DV"], heads["TAIL_DV"]))


def _host_kv_descriptors(k: torch.Tensor, v: torch.Tensor, rank: int, kv_tile, heads: dict) -> tuple:
    """The forward's K, V descriptors and their channel tails' (host_descriptors.py; None for a
    tail the head does not have)."""
    k_desc, k_tail = token_descriptors(k, rank, _pad3(kv_tile, 1), heads["BLOCK_D"], heads["TAIL_D"])
    v_desc, v_tail = token_descriptors(v, rank, _pad3(kv_tile, 1), heads["BLOCK_DV"], heads["TAIL_DV"])
    return k_desc, v_desc, k_tail, v_tail


def _query_boxes(rank: int, geo: "Geometry", heads: dict, tile, q: torch.Tensor, out: torch.Tensor) -> tuple:
    """(Q through a box?, output through a box?, Q's descriptor, the output's) for the forward
    (HOST_QUERY_BOXES; None where not): one head block each way, and the tensor fits a host
    descriptor."""
    def box(t, width, wanted):
        fit = (wanted and not heads["TAIL_D"] and not heads["TAIL_DV"] and use_descriptors(True, False, t)
               and host_descriptors_fit(rank, geo.Dl, t, heads[width], 0))
        return fit, token_descriptors(t, rank, _pad3(tile, 1), heads[width], 0)[0] if fit else None

    q_fit, q_desc = box(q, "BLOCK_D", HOST_QUERY_BOXES["query"])
    o_fit, o_desc = box(out, "BLOCK_DV", HOST_QUERY_BOXES["output"])
    return q_fit, o_fit, q_desc, o_desc


def _host_query_descriptors(q: torch.Tensor, do: torch.Tensor, stats: torch.Tensor, rank: int, q_tile,
                            heads: dict) -> tuple:
    """The dK/dV kernel's Q, dO descriptors, their channel tails' (None where the head has none)
    and that of the statistics rows (16 bytes a row: one box is one row per query)."""
    tile = _pad3(q_tile, 1)
    q_desc, q_tail = token_descriptors(q, rank, tile, heads["BLOCK_D"], heads["TAIL_D"])
    do_desc, do_tail = token_descriptors(do, rank, tile, heads["BLOCK_DV"], heads["TAIL_DV"])
    stats_desc, _ = token_descriptors(stats, rank, tile, 4, 0)
    return q_desc, do_desc, q_tail, do_tail, stats_desc


# Triton 3.6 miscompiles the split head's tail product in three TF32 parts ("tf32x3") on sm_90:
# float32 forwards of 64 queries on 8 warps at head dims 72, 80 and 144 read illegal addresses or
# came out wrong (errors 4e-5 to 6e-5, float32's tolerance being 1e-5), while the same tiles on 4
# warps, with one padded block, with "ieee" or "tf32" products, and the probe's bfloat16 cases were
# right (H200, 2026-11-29, benchmarks/probe_forward_configs.py; RESULTS.md "Random problems
# through the compiled kernels"). So float32 products in three parts always take one padded
# block, in every kernel and config.
SPLIT_HEADS_UNSAFE_PRECISIONS = ("tf32x3",)


def head_block_constexprs(problem: Problem, cfg: dict, precision: str, atomic_dq: bool = False) -> dict:
    """The head and value widths a neighbourhood kernel multiplies in (tiles.head_blocks), as its
    BLOCK_D / TAIL_D / BLOCK_DV / TAIL_DV constexprs; the config part's ``split_heads`` turns the
    split off, and the atomic dQ (one padded block) and products of SPLIT_HEADS_UNSAFE_PRECISIONS
    never take it."""
    split = (cfg.get("split_heads", tiles.SPLIT_HEADS) and not atomic_dq
             and precision not in SPLIT_HEADS_UNSAFE_PRECISIONS)
    return dict(zip(("BLOCK_D", "TAIL_D", "BLOCK_DV", "TAIL_DV"), tiles.head_blocks(problem, split)))


def relative_slots(axis, pattern: str, device) -> Tuple[torch.Tensor, torch.Tensor]:
    """This axis' ``slots_of_entries``: slot p of query coordinate x is key ``lo(x) + p`` (group
    units), table entry lo(x) - x // dilation + K - 1 + p. A slot whose entry falls outside the
    table lies past the query's count, where dS holds zeros, and is left out."""
    x = torch.arange(axis.length, device=device)
    _, lo, _ = key_range(axis, pattern, x)
    return slots_of_entries(lo - x // axis.dilation + axis.window - 1, axis.window)


def rpb_gradient(problem: Problem, ds: torch.Tensor, rpb: torch.Tensor) -> torch.Tensor:
    """The bias table's gradient from the dQ kernel's dS buffer [B, H, N, prod(K)], folded axis
    by axis (relative_fold: deterministic; a sort plus a float64 prefix sum over all
    B*H*N*prod(K) values took 17 ms of a 3-D 7x9x9 problem's backward on an H100, 2026-11-25, and
    dense per-axis one-hot products 4-5 GiB on long axes with large windows). Accumulated in
    float64, whole heads at a time."""
    H = problem.heads
    slots = [relative_slots(axis, problem.pattern, ds.device) for axis in problem.axes]
    per_head = ds[0].numel() // H  # N * prod(K)
    step = max(1, RPB_GRADIENT_CHUNK // (8 * per_head))  # heads per float64 copy
    table = []
    for h0 in range(0, H, step):
        g = ds[:, h0:h0 + step].sum(0).double().reshape(-1, *problem.spatial, *problem.window)
        table.append(fold_into_table(g, slots))
    return torch.cat(table).to(rpb.dtype).reshape(rpb.shape)


# Bytes of the float64 copy of dS the bias gradient makes at a time: whole heads, at least one. The
# dS buffer itself is float32 [B, H, N, prod(K)] (3.7 GB for the 3-D 16x48x48 7x15x15 problem
# with 16 heads); a float64 copy of all of it would double that.
RPB_GRADIENT_CHUNK = 256 * 2**20


def row_statistics(out: torch.Tensor, grad_out: torch.Tensor, lse: torch.Tensor,
                   grad_lse: Optional[torch.Tensor]) -> torch.Tensor:
    """The backward's per-row numbers, float32 ``[B, *spatial, H, 4]``: ``lse * log2(e)`` and
    delta = rowsum(dO * O) - dLSE (dS = P * (dP - delta) then carries the gradients of both
    outputs, as d lse / d s = P), then two zeros that make a row 16 bytes (row_stats_kernel)."""
    dv = out.shape[-1]
    o = out.reshape(-1, dv)
    do = grad_out.reshape(-1, dv)
    stats = torch.empty(*out.shape[:-1], 4, dtype=torch.float32, device=out.device)
    # row_stats_kernel reads LSE and dLSE rows consecutively (reshape may keep a strided view).
    lse_rows = lse.contiguous().reshape(-1)
    dlse = grad_lse.float().contiguous().reshape(-1) if grad_lse is not None else lse_rows
    key = (o.shape, tensor_layout(o), tensor_layout(do), grad_lse is not None, interpreting())
    cached(_STATS_PLANS, key, lambda: _stats_launch(o, do, lse_rows, dlse, stats, grad_lse is not None))(
        o, do, lse_rows, dlse, stats)
    return stats


_STATS_PLANS = plan_cache()
_BACKWARD_PLANS = plan_cache()
STATS_ROWS = 64


def _stats_launch(o, do, lse_rows, dlse, stats, has_dlse: bool) -> Launch:
    rows, dv = o.shape
    return Launch(row_stats_kernel, (cdiv(rows, STATS_ROWS),),
                  [o, do, lse_rows, dlse, stats, rows, o.stride(0), do.stride(0), dv],
                  dict(BLOCK_R=STATS_ROWS, BLOCK_DV=_block(dv), HAS_DLSE=has_dlse, num_warps=4))


def backward(problem: Problem, inputs: AttentionInputs, out, lse, grad_out, grad_lse, needs_grad, config=None):
    if batch_slices.needs_slices(problem):
        return batch_slices.backward_in_slices(backward, problem, inputs, out, lse, grad_out, grad_lse, needs_grad,
                                               config)
    q, k, v = (_unit_last(t) for t in inputs[:3])
    ak, av = _unit_last(inputs.additional_keys), _unit_last(inputs.additional_values)
    rpb = inputs.rpb
    do = _unit_last(grad_out)
    need_q, need_k, need_v, need_rpb, _, need_ak, need_av = (bool(n) for n in needs_grad)
    need_rpb = need_rpb and rpb is not None
    need_ak = need_ak and ak is not None
    need_av = need_av and av is not None
    precision = _precision(q.dtype)
    config = config or tiles.default_config(problem, exact_float32=exact_float32_products(precision))
    # Opt-in only: the config asks for it (a tuned one, say) and non-determinism is allowed.
    atomic = bool(config.get("dkdv", {}).get("atomic_dq")) and tiles.atomic_dq_allowed() and (need_q or need_rpb)
    flags = (need_q, need_k, need_v, need_rpb, need_ak, need_av, atomic, grad_lse is not None)
    if dq_kernel_runs(flags):
        # dq_kernel, first of the launches, writes the statistics rows as it goes (own_row_stats).
        out = _unit_last(out)
        stats = torch.empty(*out.shape[:-1], 4, dtype=torch.float32, device=out.device)
        lse = lse.contiguous()
        grad_lse = grad_lse.float().contiguous() if grad_lse is not None else None
    else:
        stats = row_statistics(out, do, lse, grad_lse)
    # Atomic mode: the KV-major passes produce dQ (float32, summed by atomics) and the dS buffer,
    # so they run whenever those are needed, into scratch for the key/value gradients not asked for.
    run_dkdv = need_k or need_v or atomic
    run_extra = need_ak or need_av or (atomic and need_q and ak is not None)
    dq = torch.empty_like(q) if (need_q or need_rpb) and not atomic else None
    dq_sum = torch.zeros(q.shape, dtype=torch.float32, device=q.device) if atomic and need_q else None
    ds_buffer = (torch.zeros(problem.batch, problem.heads, problem.tokens, problem.window_tokens, dtype=torch.float32,
                             device=q.device) if need_rpb else None)
    dk, dv = (torch.empty_like(k), torch.empty_like(v)) if run_dkdv else (None, None)
    dak, dav = (torch.empty_like(ak), torch.empty_like(av)) if run_extra else (None, None)
    mods = fused_mods(problem)
    tensors = dict(q=q, k=k, v=v, do=do, out=out, stats=stats, dq=dq, rpb=rpb, ds=ds_buffer, ak=ak, av=av,
                   dk=dk, dv=dv, dak=dak, dav=dav, dq_sum=dq_sum, lse=lse, dlse=grad_lse,
                   **dict(zip(MOD_TENSOR_NAMES, mod_tensors(mods, q))))
    key = (problem, config_key(config), flags, precision,
           *(tensor_layout(t) for t in (q, k, v, do, out, stats, rpb, ak, av, dq, dk, dv, lse, grad_lse)))

    mod_list = [tensors[name] for name in MOD_TENSOR_NAMES]

    def run(launches):
        for launch, names in launches:
            args = [tensors[name] if tensors[name] is not None else q for name in names]
            if isinstance(launch, LivePlan):
                _start(launch.launch, *args, launch.live_lists(mod_list, q))
            else:
                _start(launch, *args)

    _run_fitted(_BACKWARD_PLANS, key, problem, config,
                lambda cfg: _backward_launches(problem, cfg, flags, tensors, mods), run,
                before_retry=dq_sum.zero_ if dq_sum is not None else None)

    if dq_sum is not None:
        dq = dq_sum.mul_(problem.scale).to(q.dtype)
    drpb = rpb_gradient(problem, ds_buffer, rpb) if need_rpb else None
    return (dq if need_q else None, dk if need_k else None, dv if need_v else None, drpb, None,
            dak if need_ak else None, dav if need_av else None)


def dq_kernel_runs(flags) -> bool:
    """Whether the backward launches dq_kernel (not when only dK/dV are asked for, nor in the
    atomic mode, where the KV-major pass adds dQ)."""
    need_q, _, _, need_rpb, _, _, atomic, _ = flags
    return (need_q or need_rpb) and not atomic


MOD_TENSOR_NAMES = ("mod0", "mod1", "mod2", "mod3")


def _backward_launches(problem: Problem, config, flags, tensors, mods=None) -> list:
    """The backward's kernel launches for these gradients, each with the names of its tensors in
    order (a name whose tensor is absent is passed ``q``, which the kernel does not read)."""
    need_q, need_k, need_v, need_rpb, need_ak, need_av, atomic, has_dlse = flags
    cfgs = tiles.normalise(config, problem)
    t = {name: (value if value is not None else tensors["q"]) for name, value in tensors.items()}
    q, k, v, do, rpb, ak, av = (tensors[name] for name in ("q", "k", "v", "do", "rpb", "ak", "av"))
    B, H, Hkv, r = problem.batch, problem.heads, problem.kv_heads, problem.rank
    G = H // Hkv
    geo = geometry(problem)
    large = needs_int64(q, k, v, do, tensors["out"])
    softcap = problem.softcap or 1.0
    feature = dict(HAS_SOFTCAP=problem.softcap is not None, LARGE=large, PRECISION=_precision(q.dtype), RANK=r)
    with_mods = mod_constexprs(problem, mods, large, gradient=True)
    wide_index = with_mods["WIDE_INDEX"]
    stats_strides = token_strides(tensors["stats"], r)
    launches = []

    gluon_dq = None
    if dq_kernel_runs(flags):
        from . import gluon_dq_launch  # (here: it takes this module's helpers)

        gluon_dq = gluon_dq_launch.plan(problem, cfgs["dq"], tensors)
    if gluon_dq is not None:
        launches.append((gluon_dq, gluon_dq_launch.TENSORS))
    elif dq_kernel_runs(flags):
        cfg = cfgs["dq"]
        live = live_steps(problem, mods, geo, cfg, False, wide_index, _tile_constexprs(cfg["q"], cfg["kv"], r), q.device)
        names = ("q", "k", "v", "do", "stats", "dq", "rpb", "ds", "ak", "av", "out", "lse", "dlse", *MOD_TENSOR_NAMES)
        heads = head_block_constexprs(problem, cfg, feature["PRECISION"])
        tma = use_descriptors(cfg.get("tma", False), large, k, v)
        host = tma and _host_descriptors_fit(r, geo, heads, k, v)
        kv_descs = _host_kv_descriptors(k, v, r, cfg["kv"], heads) if host else (None,) * 4
        launches.append((LivePlan(Launch(dq_kernel, (geo.grid0(cfg["q"]), H, B), [
            *(t[name] for name in names), q,  # q: the place of the live-step lists, given per call
            *kv_descs,
            *token_strides(q, r), *token_strides(k, r), *token_strides(v, r), *token_strides(do, r),
            *stats_strides, *token_strides(t["out"], r), *token_strides(t["lse"], r),
            *token_strides(t["dq"], r), *_rpb_strides(rpb, r), *_extra_strides(ak), *_extra_strides(av),
            H, G, problem.extra_tokens, problem.head_dim, problem.value_dim,
            *geo.runtime_args(cfg["q"]), problem.scale, softcap,
        ], dict(
            **geo.constexprs(), **_tile_constexprs(cfg["q"], cfg["kv"], r), **feature, **heads,
            HAS_RPB=rpb is not None, RPB_GRAD=need_rpb, HAS_EXTRA=ak is not None,
            TMA=tma and not host, HOST_TMA=host, **_walk_constexprs(cfg),
            HAS_DLSE=has_dlse, WAIT_DQ=cfg.get("wait_dq", False), **with_mods, **_live_arguments(live),
            num_warps=cfg["warps"], num_stages=cfg["stages"],
        ), KV_DESCRIPTOR_BASES), live), names))

    dq_sum_strides = token_strides(t["dq_sum"], r)
    gluon_dkdv = None
    if (need_k or need_v) and not atomic:
        from . import gluon_dkdv_launch  # (here: it takes this module's helpers)

        gluon_dkdv = gluon_dkdv_launch.plan(problem, cfgs["dkdv"], tensors)
    if gluon_dkdv is not None:
        launches.append((gluon_dkdv, gluon_dkdv_launch.TENSORS))
    elif need_k or need_v or atomic:
        cfg = cfgs["dkdv"]
        tma = use_descriptors(cfg.get("tma", False), large, q, do)
        heads = head_block_constexprs(problem, cfg, feature["PRECISION"], atomic_dq=atomic and need_q)
        host = (tma and _host_descriptors_fit(r, geo, heads, q, do)
                and host_descriptors_fit(r, geo.Dl, tensors["stats"], 4, 0))
        q_descs = _host_query_descriptors(q, do, tensors["stats"], r, cfg["q"], heads) if host else (None,) * 5
        live = live_steps(problem, mods, geo, cfg, True, wide_index, _tile_constexprs(cfg["q"], cfg["kv"], r), q.device)
        names = ("q", "k", "v", "do", "stats", "dk", "dv", "rpb", "dq_sum", "ds", *MOD_TENSOR_NAMES)
        launches.append((LivePlan(Launch(dkdv_kernel, (geo.grid0(cfg["kv"]), Hkv, B), [
            *(t[name] for name in names), q,  # q: the place of the live-step lists, given per call
            *q_descs,
            *token_strides(q, r), *token_strides(k, r), *token_strides(v, r), *token_strides(do, r),
            *stats_strides, *token_strides(t["dk"], r), *token_strides(t["dv"], r), *_rpb_strides(rpb, r),
            *dq_sum_strides, H, G, problem.head_dim, problem.value_dim,
            *geo.runtime_args(cfg["kv"]), problem.scale, softcap,
        ], dict(
            **geo.constexprs(), **_tile_constexprs(cfg["q"], cfg["kv"], r), **feature, **heads,
            HAS_RPB=rpb is not None, TMA=tma and not host, HOST_TMA=host, ATOMIC_DQ=atomic and need_q,
            RPB_GRAD=atomic and need_rpb,
            TMA_DQ=atomic and need_q and cfg.get("tma_dq", True) and use_reduce_descriptors(large, tensors["dq_sum"]),
            WAIT_DK=cfg.get("wait_dk", False), **_walk_constexprs(cfg), **with_mods, **_live_arguments(live),
            num_warps=cfg["warps"], num_stages=cfg["stages"],
        ), QUERY_DESCRIPTOR_BASES), live), names))

    if need_ak or need_av or (atomic and need_q and ak is not None):
        names = ("q", "ak", "av", "do", "stats", "dak", "dav", "dq_sum", *MOD_TENSOR_NAMES)
        exact = exact_float32_products(feature["PRECISION"])
        block_m, block_e, stages = tiles.extra_kernel_blocks(problem, exact)
        launches.append((Launch(extra_dkdv_kernel, (cdiv(problem.extra_tokens, block_e), Hkv, B), [
            *(t[name] for name in names),
            *token_strides(q, r), *_extra_strides(ak), *_extra_strides(av), *token_strides(do, r),
            *stats_strides, *_extra_strides(t["dak"]), *_extra_strides(t["dav"]), *dq_sum_strides,
            G, problem.extra_tokens, problem.head_dim, problem.value_dim, *geo.L,
            problem.scale, softcap,
        ], dict(
            BLOCK_M=block_m, BLOCK_E=block_e, HAS_SOFTCAP=problem.softcap is not None, LARGE=large,
            PRECISION=feature["PRECISION"], BLOCK_D=_block(problem.head_dim), BLOCK_DV=tiles.value_block(problem),
            ATOMIC_DQ=atomic and need_q, **with_mods, num_warps=tiles.extra_kernel_warps(problem, exact),
            num_stages=stages,
        )), names))
    return launches
