"""Host side of the fused key-query convolution (kq_conv_kernel, kq_conv_backward): tiles, the
band matrices of the kernel rows, each tile's run of keys or rows, the launches, and the host's
share of the backward (the halos' dK added to their columns, dW summed over programs, rpb's
gradient folded), all deterministic.
"""

from __future__ import annotations

import functools
from typing import Dict, List, Optional, Tuple

import torch
from triton.runtime.errors import OutOfResources

from haloattn.backend import AttentionInputs
from haloattn.geometry import key_range
from haloattn.problem import Problem

from . import batch_slices, fast_launch, launch
from . import tiles as tiles_module
from .backward_kernels import extra_dkdv_kernel
from .kq_conv_backward import dkdv_kernel, dq_dw_kernel
from .fast_launch import Launch, cached, config_key, plan_cache, tensor_layout
from .kq_conv_kernel import kq_conv_forward_kernel
from .launch import _precision, _unit_last, cdiv, needs_int64
from .tiles import pow2_ceil

# Limits of the fused kernels (beyond them the reference backend runs the problem, and explain()
# says why): dq_dw_kernel takes the rows its shifts reach from one 16-row tile after its own
# (kq_conv_backward.TAIL) and holds one dW accumulator a kernel row, and a halo is one tile of
# HALO columns.
MAX_ROW_SHIFTS = 16
MAX_KEY_REACH = 64

# Tiles: BM query rows, BN key columns, BE additional tokens a step. Every product has a side of
# at least 16 (tl.dot). 64 x 64 keeps the score tile, its convolution and the output accumulator
# of a 128-channel head within one warpgroup's registers; wider heads halve the key tile.
DEFAULT_TILES = {"block_m": 64, "block_n": 64, "warps": 4, "stages": 2}
WIDE_HEAD_TILES = {"block_m": 64, "block_n": 32, "warps": 8, "stages": 2}
WIDE_HEAD = 128
# The backward's: 32-column key tiles keep dq_dw_kernel's band-shaped dW accumulators (c_q of
# them, (BN + 2 * HALO) x BN each) small.
BACKWARD_TILES = {"block_m": 64, "block_n": 32, "warps": 8, "stages": 1}
# Float32 operands double every product's shared-memory buffers: at 64 rows dq_dw_kernel of MTA's
# 6x11 on 128-channel heads asked for 256 KiB on sm_90 (compile_report_kq_conv.py), 32 fit in 176.
FLOAT32_BACKWARD_TILES = dict(BACKWARD_TILES, block_m=32)
EXTRA_BLOCK = 16


def not_supported_reasons(problem: Problem) -> List[str]:
    """Why the fused kernel cannot run this kq_conv problem (empty: it can)."""
    c_q, c_k = problem.kq_conv_shape
    reasons = []
    if c_q > MAX_ROW_SHIFTS:
        reasons.append(f"kq_conv has c_q={c_q} kernel rows; the fused kernels take at most {MAX_ROW_SHIFTS}")
    if (c_k - 1) // 2 > MAX_KEY_REACH:
        reasons.append(f"kq_conv has c_k={c_k} (reach {(c_k - 1) // 2}); the fused kernel reaches at most "
                       f"{MAX_KEY_REACH} keys either side (c_k <= {2 * MAX_KEY_REACH + 1})")
    return reasons


def default_config(problem: Problem) -> Dict:
    """The forward's tiles (``kq``) and the backward's (``kq_bwd``)."""
    tiles = WIDE_HEAD_TILES if max(problem.head_dim, problem.value_dim) > WIDE_HEAD else DEFAULT_TILES
    backward = FLOAT32_BACKWARD_TILES if problem.dtype == torch.float32 else BACKWARD_TILES
    return {"kq": dict(tiles), "kq_bwd": dict(backward)}


def candidate_configs(problem: Problem) -> List[Dict]:
    """The tuning space: the defaults, then other forward tiles (``kq``) and other backward tiles
    (``kq_bwd``), each beside the other part's default. None of it timed on a GPU yet."""
    base = default_config(problem)
    out = [base]
    for block_m, block_n, warps, stages in ((64, 64, 4, 1), (64, 32, 4, 2), (128, 64, 8, 2), (64, 64, 8, 2),
                                            (32, 32, 4, 2)):
        cfg = {"kq": {"block_m": block_m, "block_n": block_n, "warps": warps, "stages": stages}}
        if cfg["kq"] != base["kq"]:
            out.append(cfg)
    for block_m, block_n, warps in ((64, 64, 8), (64, 32, 4), (32, 32, 4)):
        out.append({"kq_bwd": {"block_m": block_m, "block_n": block_n, "warps": warps, "stages": 1}})
    return out


def normalise(config, problem: Problem) -> Dict:
    """The config's tiles, each a power of two >= 16, defaults filling what is missing or bad."""
    base = default_config(problem)["kq"]
    given = (config or {}).get("kq") if isinstance(config, dict) else None
    tiles = dict(base, **(given if isinstance(given, dict) else {}))
    for name in ("block_m", "block_n"):
        value = tiles[name]
        if not isinstance(value, int) or value < 16 or value & (value - 1):
            tiles[name] = base[name]
    for name in ("warps", "stages"):
        if not isinstance(tiles[name], int) or tiles[name] < 1:
            tiles[name] = base[name]
    return tiles


def halo(problem: Problem) -> int:
    """Columns of each halo tile: 0 without a reach along the keys, else a power of two >= 16."""
    reach = (problem.kq_conv_shape[1] - 1) // 2
    return 0 if reach == 0 else max(16, pow2_ceil(reach))


def toeplitz_bands(weight: torch.Tensor, block_n: int, halo_cols: int, dtype: torch.dtype) -> torch.Tensor:
    """``[H, c_q, block_n + 2 * halo_cols, block_n]``: row ``a`` of each head's kernel as the band
    matrix from a key tile's source columns (its left halo, itself, its right halo) to its target
    columns, ``W[h, a, t]`` where source column minus target column equals ``t - reach``."""
    c_k = weight.shape[2]
    reach = (c_k - 1) // 2
    u = torch.arange(block_n + 2 * halo_cols, device=weight.device)[:, None]
    j = torch.arange(block_n, device=weight.device)[None, :]
    t = u - halo_cols - j + reach
    inside = (t >= 0) & (t < c_k)
    bands = weight.detach().to(torch.promote_types(dtype, torch.float32))[:, :, t.clamp(0, c_k - 1)] * inside
    return bands.to(dtype).contiguous()


def tf32_nearest(t: torch.Tensor) -> torch.Tensor:
    """float32 ``t`` rounded to the nearest TF32 value (kq_conv_scores.tf32_nearest, on the host).
    Why: with TF32 products the tensor cores drop each operand's low 13 bits. A float64 emulation
    of a float16 problem of test_triton_kq_conv_gpu.py (seed 2: length 371, window 85, dilation 3,
    stride 75, causal, 2 x 5 kernel) put the kernel weight's gradient 2.9e-3 off with S0 and the
    weights so truncated, 1.8e-3 with them rounded to nearest (float16 tolerance 2e-3; an H100
    measured 2.7e-3 before this rounding); the output 5.2e-4 and 1.9e-4."""
    bits = t.contiguous().view(torch.int32)
    return ((bits + 0x1000) & ~0x1FFF).view(torch.float32)


def conv_bands(weight: torch.Tensor, block_n: int, halo_cols: int, conv: str) -> torch.Tensor:
    """The band matrices (toeplitz_bands, float32) as the convolution's products take them:
    rounded to nearest TF32 for TF32 products (see tf32_nearest)."""
    bands = toeplitz_bands(weight, block_n, halo_cols, torch.float32)
    return tf32_nearest(bands) if conv == "tf32" else bands


def _row_bounds(axis, pattern: str) -> Tuple[torch.Tensor, torch.Tensor]:
    """First and last grid column each grid row sees (its keys are every ``dilation``-th column
    between them)."""
    group, lo, hi = key_range(axis, pattern, torch.arange(axis.length))
    return group + axis.dilation * lo, group + axis.dilation * (hi - 1)


def _column_spans(first: torch.Tensor, last: torch.Tensor, block_m: int, rows_after: int) -> torch.Tensor:
    """``[first, last + 1)`` over the rows of each BM-row tile and the ``rows_after`` rows after
    it, flattened (rows past the grid repeat the last row)."""
    span = cdiv(first.numel(), block_m) * block_m + rows_after
    pad = span - first.numel()
    f = torch.cat([first, first[-1:].expand(pad)]).unfold(0, block_m + rows_after, block_m).amin(1)
    g = torch.cat([last, last[-1:].expand(pad)]).unfold(0, block_m + rows_after, block_m).amax(1)
    return torch.stack([f, g + 1], 1).reshape(-1)


@functools.lru_cache(maxsize=256)
def _runs_on_host(axis, pattern: str, block_m: int) -> Tuple[int, ...]:
    return tuple(_column_spans(*_row_bounds(axis, pattern), block_m, 0).tolist())


def tile_runs(problem: Problem, block_m: int, device) -> torch.Tensor:
    """``[tiles, 2]`` int32: the grid columns ``[first, last + 1)`` the rows of each BM-row query
    tile see (one run: the key ranges are monotone in the row within a dilation group, and a
    tile's groups interleave)."""
    return torch.tensor(_runs_on_host(problem.axes[0], problem.pattern, block_m), dtype=torch.int32, device=device)


def conv_precision(dtype: torch.dtype, precision: str) -> str:
    """How S0 meets the band matrices in the forward: TF32 for 16-bit inputs (bfloat16 operands
    would carry 8 bits, about 8x the convolution's rounding: 3.9e-3 against 4.9e-4 in the output in
    a float64 emulation at MTA's 6x11); float32 inputs as their own products (precision).
    float16 operands (10 bits, at twice TF32's rate) were used for float16 inputs until
    2026-12-05: the backward recomputes the convolved scores in TF32, which rounds S0 otherwise,
    so its P missed the forward's LSE and every float16 gradient came out 2.4e-3 to 7.9e-3 off
    (tolerance 2e-3; outputs 5e-4) on an H100 (RESULTS.md, "Key-query convolution"). The forward
    and the backward now form the scores alike."""
    if precision == "interpret":
        return "interpret"
    if dtype in (torch.float16, torch.bfloat16):
        return "tf32"
    return precision


# Launch plans per (problem, config, layouts). The band matrices are rebuilt every call (a gather
# of H * c_q * (BN + 2 * HALO) * BN values): cached ones could outlive weights computed afresh
# each step at the same address.
_FORWARD_PLANS = plan_cache()


# Tiles that fitted the GPU's shared memory, per (problem, config, precision, pass), where the
# config's did not (see _fitted).
_FITTED = plan_cache()
MAX_REFITS = 6


def _fitted(key, tiles: Dict, shrink, run):
    """``run(tiles)``, with tiles shrunk (``shrink``) and the run repeated while Triton refuses a
    kernel for its shared memory: the estimate is the compiler's (smaller GPUs than Hopper, float32
    operands, wide heads); the tiles that fitted are kept for the next call. Every run writes its
    outputs whole, so a repeat leaves nothing of the refused one."""
    tiles = _FITTED.get(key, tiles)
    for _ in range(MAX_REFITS):
        try:
            return run(tiles)
        except OutOfResources as err:
            smaller = shrink(tiles) if err.name == "shared memory" else None
            if smaller is None:
                raise
            if len(_FITTED) >= 1024:
                _FITTED.clear()
            tiles = _FITTED[key] = smaller
    return run(tiles)


def _smaller_forward(tiles: Dict) -> Optional[Dict]:
    """One step down: no prefetch stage, then narrower key tiles, then fewer query rows."""
    if tiles["stages"] > 1:
        return dict(tiles, stages=1)
    if tiles["block_n"] > 16:
        return dict(tiles, block_n=tiles["block_n"] // 2)
    if tiles["block_m"] > 16:
        return dict(tiles, block_m=tiles["block_m"] // 2)
    return None


def forward(problem: Problem, inputs: AttentionInputs, config=None) -> Tuple[torch.Tensor, torch.Tensor]:
    if batch_slices.needs_slices(problem):  # more batch entries than a grid axis holds
        return batch_slices.forward_in_slices(forward, problem, inputs, config)
    q, k, v = (_unit_last(t) for t in inputs[:3])
    ak, av = _unit_last(inputs.additional_keys), _unit_last(inputs.additional_values)
    rpb = inputs.rpb
    precision = _precision(q.dtype)
    conv = conv_precision(q.dtype, precision)
    halo_cols = halo(problem)
    out = torch.empty(*q.shape[:-1], problem.value_dim, dtype=q.dtype, device=q.device)
    lse = torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)
    placeholder = q  # tensors the kernel does not read without their feature

    def run(tiles):
        bands = conv_bands(inputs.kq_conv, tiles["block_n"], halo_cols, conv)
        runs = tile_runs(problem, tiles["block_m"], q.device)
        key = (problem, config_key(config), tuple(tiles.items()), tensor_layout(q), tensor_layout(k),
               tensor_layout(v), tensor_layout(rpb), tensor_layout(ak), tensor_layout(av), tensor_layout(bands),
               precision)
        launch = cached(_FORWARD_PLANS, key, lambda: _launch(problem, tiles, precision, conv, halo_cols, q, k, v,
                                                             out, lse, bands, runs, rpb, ak, av))
        launch(q, k, v, out, lse, bands, runs, rpb if rpb is not None else placeholder,
               ak if ak is not None else placeholder, av if av is not None else placeholder)

    _fitted((problem, config_key(config), precision, "forward"), normalise(config, problem), _smaller_forward, run)
    return out, lse


def _launch(problem, tiles, precision, conv, halo_cols, q, k, v, out, lse, bands, runs, rpb, ak, av) -> Launch:
    axis = problem.axes[0]
    H, B = problem.heads, problem.batch
    c_q = problem.kq_conv_shape[0]
    placeholder = q

    def strides3(t):  # (batch, token, head) strides of [B, L, H, D] (or [B, L, H])
        return [t.stride(0), t.stride(1), t.stride(2)]

    rpb_strides = [rpb.stride(0), rpb.stride(1)] if rpb is not None else [0, 0]
    extra_strides = (strides3(ak) + strides3(av)) if ak is not None else [0] * 6
    return Launch(kq_conv_forward_kernel, (cdiv(axis.length, tiles["block_m"]), H, B), [
        q, k, v, out, lse, bands, runs, rpb if rpb is not None else placeholder,
        ak if ak is not None else placeholder, av if av is not None else placeholder,
        *strides3(q), *strides3(k), *strides3(v), *strides3(out), *strides3(lse.unsqueeze(-1)),
        bands.stride(0), bands.stride(1), *rpb_strides, *extra_strides,
        H // problem.kv_heads, problem.extra_tokens, problem.head_dim, problem.value_dim,
        axis.length, axis.dilation, axis.window, axis.stride, axis.shift, problem.scale, problem.softcap or 1.0,
    ], dict(
        CAUSAL=axis.causal, WINDOW=problem.pattern == "window", C_Q=c_q, HALO=halo_cols,
        BM=tiles["block_m"], BN=tiles["block_n"], BE=EXTRA_BLOCK,
        BLOCK_D=max(16, pow2_ceil(problem.head_dim)), BLOCK_DV=max(16, pow2_ceil(problem.value_dim)),
        HAS_RPB=rpb is not None, HAS_SOFTCAP=problem.softcap is not None, HAS_EXTRA=ak is not None,
        LARGE=needs_int64(q, k, v, out), PRECISION=precision, CONV_PRECISION=conv,
        num_warps=tiles["warps"], num_stages=tiles["stages"],
    ))


def backward_tiles(config, problem: Problem) -> Dict:
    """The backward's tiles (config part ``kq_bwd``): BM source or target rows, BN key columns
    (at least a halo wide, so that each halo spills into one neighbouring tile)."""
    base = default_config(problem)["kq_bwd"]
    given = config.get("kq_bwd") if isinstance(config, dict) else None
    tiles = dict(base, **(given if isinstance(given, dict) else {}))
    for name in ("block_m", "block_n"):
        value = tiles[name]
        if not isinstance(value, int) or value < 16 or value & (value - 1):
            tiles[name] = base[name]
    tiles["block_n"] = max(tiles["block_n"], halo(problem))
    for name in ("warps", "stages"):
        if not isinstance(tiles[name], int) or tiles[name] < 1:
            tiles[name] = base[name]
    return tiles


@functools.lru_cache(maxsize=256)
def _backward_runs_on_host(problem: Problem, block_m: int, block_n: int) -> Tuple[Tuple[int, ...], Tuple[int, ...]]:
    L = problem.axes[0].length
    first, last = _row_bounds(problem.axes[0], problem.pattern)
    # dq_dw_kernel: a tile of source rows needs dC on its rows and the c_q - 1 after them
    query_runs = _column_spans(first, last, block_m, problem.kq_conv_shape[0] - 1)
    # dkdv_kernel: the rows that see a column of the key tile: from the first row whose last
    # column reaches the tile (running maximum) to the last whose first column lies before its end
    # (running minimum from the end)
    starts = torch.arange(0, L, block_n)
    reach = torch.cummax(last, 0).values
    before = torch.flip(torch.cummin(torch.flip(first, [0]), 0).values, [0])
    row_lo = torch.searchsorted(reach, starts)
    row_hi = torch.maximum(torch.searchsorted(before, starts + block_n), row_lo)
    key_runs = torch.stack([row_lo, row_hi], 1).reshape(-1)
    return tuple(query_runs.tolist()), tuple(key_runs.tolist())


def backward(problem, inputs, out, lse, grad_out, grad_lse, needs_grad, config=None):
    """Every gradient the call needs: dq_dw_kernel, dkdv_kernel, and for additional tokens the
    neighbourhood backward's extra_dkdv_kernel."""
    if batch_slices.needs_slices(problem):
        return batch_slices.backward_in_slices(backward, problem, inputs, out, lse, grad_out, grad_lse, needs_grad,
                                               config)
    q, k, v = (_unit_last(t) for t in inputs[:3])
    ak, av = _unit_last(inputs.additional_keys), _unit_last(inputs.additional_values)
    grad_out = _unit_last(grad_out)
    rpb = inputs.rpb
    precision = _precision(q.dtype)
    grad_precision = "interpret" if precision == "interpret" else ("tf32" if q.dtype.itemsize == 2 else precision)
    halo_cols = halo(problem)
    delta = (grad_out.float() * out.float()).sum(-1)
    if grad_lse is not None:
        delta = delta - grad_lse.float()
    delta = delta.contiguous()
    B, L, H, Hkv = problem.batch, problem.axes[0].length, problem.heads, problem.kv_heads
    c_q, c_k = problem.kq_conv_shape
    D, Dv = problem.head_dim, problem.value_dim
    block_d, block_dv = max(16, pow2_ceil(D)), max(16, pow2_ceil(Dv))
    dq = torch.empty_like(q)
    dk = torch.empty(B, L, Hkv, D, dtype=torch.float32, device=q.device)
    dv = torch.empty(B, L, Hkv, Dv, dtype=v.dtype, device=q.device)
    placeholder = rpb if rpb is not None else q
    axis = problem.axes[0]
    # rpb's gradient: dC of every attended pair by its place in the row's window, folded per
    # relative position by the host (as launch.backward does), B x H x L x window floats
    ds = torch.empty(B, H, L, axis.window, dtype=torch.float32, device=q.device) if needs_grad[3] else None
    large = needs_int64(q, k, v, grad_out, dq, dk)

    def strides3(t):
        return [t.stride(0), t.stride(1), t.stride(2)]

    stats = [*strides3(lse.unsqueeze(-1)), *strides3(delta.unsqueeze(-1))]
    rpb_strides = [rpb.stride(0), rpb.stride(1)] if rpb is not None else [0, 0]
    extra_strides = (strides3(ak) + strides3(av)) if ak is not None else [0] * 6
    geometry = [axis.length, axis.dilation, axis.window, axis.stride, axis.shift, problem.scale, problem.softcap or 1.0]
    shared = dict(
        CAUSAL=axis.causal, WINDOW=problem.pattern == "window", C_Q=c_q, HALO=halo_cols,
        BLOCK_D=block_d, BLOCK_DV=block_dv, HAS_RPB=rpb is not None, HAS_SOFTCAP=problem.softcap is not None,
        LARGE=large, PRECISION=precision, GRAD_PRECISION=grad_precision,
    )
    dq_only = dict(HAS_DS=ds is not None, HAS_EXTRA=ak is not None, BE=EXTRA_BLOCK)

    def run(tiles):
        BM, BN = tiles["block_m"], tiles["block_n"]
        bands = conv_bands(inputs.kq_conv, BN, halo_cols, grad_precision)
        query_runs, key_runs = (torch.tensor(r, dtype=torch.int32, device=q.device)
                                for r in _backward_runs_on_host(problem, BM, BN))
        q_tiles, k_tiles = cdiv(L, BM), cdiv(L, BN)
        dw_parts = torch.empty(B, H, q_tiles, c_q, c_k, dtype=torch.float32, device=q.device)
        spill = torch.empty(B, Hkv, k_tiles, 2, max(halo_cols, 1), block_d, dtype=torch.float32, device=q.device)
        constexprs = dict(shared, BM=BM, BN=BN, num_warps=tiles["warps"], num_stages=tiles["stages"])
        if ds is not None:
            ds.zero_()  # slots past a row's keys stay 0 (launch.rpb_gradient)
        fast_launch.resolve(dq_dw_kernel)[(q_tiles, H, B)](
            q, k, v, grad_out, lse, delta, bands, query_runs, placeholder, dq, dw_parts,
            ds if ds is not None else dw_parts, ak if ak is not None else q, av if av is not None else q,
            *strides3(q), *strides3(k), *strides3(v), *strides3(grad_out), *stats, *strides3(dq),
            bands.stride(0), bands.stride(1), *rpb_strides, *extra_strides,
            H // Hkv, D, Dv, H, *geometry, c_k, problem.extra_tokens, **constexprs, **dq_only)
        fast_launch.resolve(dkdv_kernel)[(k_tiles, Hkv, B)](
            q, k, v, grad_out, lse, delta, bands, key_runs, placeholder, dk, dv, spill,
            *strides3(q), *strides3(k), *strides3(v), *strides3(grad_out), *stats, *strides3(dk), *strides3(dv),
            bands.stride(0), bands.stride(1), *rpb_strides,
            H // Hkv, D, Dv, Hkv, *geometry, **constexprs)
        return BN, dw_parts, spill

    block_n, dw_parts, spill = _fitted((problem, config_key(config), precision, "backward"),
                                       backward_tiles(config, problem), lambda t: _smaller_backward(t, problem), run)
    if halo_cols:
        dk = _with_spills(dk, spill[..., :D], block_n, halo_cols)
    drpb = launch.rpb_gradient(problem, ds, rpb) if ds is not None else None
    dak = dav = None
    if ak is not None and (needs_grad[5] or needs_grad[6]):
        dak, dav = _extra_token_gradients(problem, q, ak, av, grad_out, out, lse, grad_lse, precision, large)
    grads = [dq, dk.to(k.dtype), dv, drpb, dw_parts.sum((0, 2)).to(inputs.kq_conv.dtype), dak, dav]
    return tuple(g if wanted else None for g, wanted in zip(grads, needs_grad))


def _extra_token_gradients(problem, q, ak, av, grad_out, out, lse, grad_lse, precision, large):
    """dAK, dAV by the neighbourhood backward's extra_dkdv_kernel: an additional token's scores
    are plain whatever the convolution, and it needs only each row's LSE and delta."""
    stats = launch.row_statistics(out, grad_out, lse, grad_lse)
    dak, dav = torch.empty_like(ak), torch.empty_like(av)
    exact = launch.exact_float32_products(precision)
    block_m, block_e, stages = tiles_module.extra_kernel_blocks(problem, exact)
    fast_launch.resolve(extra_dkdv_kernel)[(cdiv(problem.extra_tokens, block_e), problem.kv_heads, problem.batch)](
        q, ak, av, grad_out, stats, dak, dav, q, *launch.mod_tensors(None, q),
        *launch.token_strides(q, 1), *launch._extra_strides(ak), *launch._extra_strides(av),
        *launch.token_strides(grad_out, 1), *launch.token_strides(stats, 1), *launch._extra_strides(dak),
        *launch._extra_strides(dav), *launch.token_strides(q, 1),
        problem.heads // problem.kv_heads, problem.extra_tokens, problem.head_dim, problem.value_dim, 1, 1,
        problem.axes[0].length, problem.scale, problem.softcap or 1.0,
        BLOCK_M=block_m, BLOCK_E=block_e, BLOCK_D=max(16, pow2_ceil(problem.head_dim)),
        BLOCK_DV=tiles_module.value_block(problem), HAS_SOFTCAP=problem.softcap is not None, LARGE=large,
        PRECISION=precision, ATOMIC_DQ=False, **launch.mod_constexprs(problem, None, large, gradient=True),
        num_warps=tiles_module.extra_kernel_warps(problem, exact),
        num_stages=stages,
    )
    return dak, dav


def _smaller_backward(tiles: Dict, problem: Problem) -> Optional[Dict]:
    """One step down: fewer rows, then narrower key tiles (never below a halo), then 4 warps."""
    if tiles["block_m"] > 16:
        return dict(tiles, block_m=tiles["block_m"] // 2)
    if tiles["block_n"] > max(16, halo(problem)):
        return dict(tiles, block_n=tiles["block_n"] // 2)
    if tiles["warps"] > 4:
        return dict(tiles, warps=4)
    return None


def _with_spills(dk: torch.Tensor, spill: torch.Tensor, block_n: int, halo_cols: int) -> torch.Tensor:
    """dK with each key tile's halo parts added to the neighbouring columns they belong to:
    ``spill[b, kvh, tile, 0]`` to columns ``[tile * BN - HALO, tile * BN)``, ``[..., 1]`` to
    ``[(tile + 1) * BN, (tile + 1) * BN + HALO)`` (HALO <= BN: each column gets at most one of
    each, added in a fixed order)."""
    B, L, Hkv, D = dk.shape
    tiles = spill.shape[2]
    full = torch.zeros(B, tiles * block_n + block_n + 2 * halo_cols, Hkv, D, dtype=dk.dtype, device=dk.device)
    full[:, halo_cols:halo_cols + L] = dk
    left = spill[:, :, :, 0].permute(0, 2, 3, 1, 4)  # [B, tiles, HALO, Hkv, D]
    right = spill[:, :, :, 1].permute(0, 2, 3, 1, 4)
    full[:, :tiles * block_n].view(B, tiles, block_n, Hkv, D)[:, :, :halo_cols] += left
    shifted = full[:, halo_cols + block_n:halo_cols + block_n + tiles * block_n]
    shifted.view(B, tiles, block_n, Hkv, D)[:, :, :halo_cols] += right
    return full[:, halo_cols:halo_cols + L]
