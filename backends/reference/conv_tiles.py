"""Query tiles for the key-query convolution (Multi-Token Attention, SEMANTICS.md section 6).

The convolution gives a target pair (i, j) the scores S0 of the pairs ``c_q - 1`` rows above
and ``(c_k - 1) / 2`` columns either side of it, masked to 0 where the source pair is not
attended. Rank 1 only, so the grid is one axis of L tokens, in grid coordinates throughout (the
shifts are in grid tokens, whatever the dilation).

A :class:`ConvTiles` block holds ``c`` tiles of ``T`` consecutive query rows. Each tile's target
keys are one run of ``P`` consecutive grid columns covering the keys of all its rows; its S0 is
one matrix product over the run widened by the kernel's reach (``T + c_q - 1`` rows by
``P + c_k - 1`` columns), and the convolution of every tile and head of the block is one grouped
``conv2d``. Keys and values are gathered once a tile, not once a row, and no per-tap gather of
scores is left, which is what made the per-row path tens of times slower than attention without
the convolution.

Blocks hold whole tiles only (the grid's last, shorter tile is a block of its own), so every row
of a block is a real query: the forward, the backward's per-block recomputation, the JVP rule and
traced (out-of-place) forwards all write a block's rows as they come.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from haloattn.backend import AttentionInputs
from haloattn.geometry import Axis, attends, key_range
from haloattn.problem import Problem
from haloattn.tracing import untraced

# Tile rows: the T of the candidates below that minimises an estimated cost per query row,
#   (T + c_q - 1) / T * (P_T + c_k - 1) + GATHER_COST * (T + c_q - 1 + P_T + c_k - 1) / T,
# the S0 entries a row's tile computes (scores, mask and convolution grow with them) plus the
# rows and columns a tile gathers, shared by its T rows (as blocks.GATHER_COST).
GATHER_COST = 6.0
TILE_ROWS = (8, 16, 32, 64, 128, 256)

# A block's S0-sized buffers (S0, its mask, the convolved scores, the softmax's intermediates:
# about BUFFERS of them) stay within the caller's bound. No smaller bound on CPUs (unlike
# tiled.STEP_BYTES): each block's gradient is taken by autograd over the whole inputs, so many
# small blocks cost more than cache misses (1 MiB blocks measured 5x slower forward and
# backward than 256 MiB ones on a 2-core EPYC, 1-D 4096 tokens, window 127, kq_conv 6x11).
BUFFERS = 8


def _run_bounds(axis: Axis, pattern: str, rows: torch.Tensor):
    """First and last grid column each row ``rows`` sees (its keys are every ``dilation``-th
    column between them)."""
    group, lo, hi = key_range(axis, pattern, rows)
    return group + axis.dilation * lo, group + axis.dilation * (hi - 1)


def _box_width(axis: Axis, pattern: str, rows: torch.Tensor) -> int:
    """Columns of the widest target run over tiles ``rows`` [c, T]."""
    first, last = _run_bounds(axis, pattern, rows)
    return int((last.amax(1) - first.amin(1)).max()) + 1


def tile_rows(problem: Problem) -> int:
    """T for this problem (see GATHER_COST); at most the grid's length."""
    return _tilings(problem.axes[0], problem.pattern, *problem.kq_conv_shape)[0][0]


# Cached per geometry (calls repeat it; a long grid costs a few ms of index arithmetic), and run
# outside any torch.jit trace (tracing.untraced), as blocks.py's cached helpers are.
@functools.lru_cache(maxsize=256)
@untraced
def _tilings(axis: Axis, pattern: str, c_q: int, c_k: int):
    """Every candidate (T, P), cheapest first (see GATHER_COST): the tile rows and the widest
    target run of such tiles."""
    L = axis.length
    ranked = []
    for T in sorted({t for t in TILE_ROWS if t < L} | {min(L, TILE_ROWS[-1])}):
        count = L // T
        P = _box_width(axis, pattern, torch.arange(count * T).view(count, T))
        cost = (T + c_q - 1) / T * (P + c_k - 1) + GATHER_COST * (T + c_q - 1 + P + c_k - 1) / T
        ranked.append((cost, T, P))
    return [(T, P) for _, T, P in sorted(ranked)]


class ConvTiles:
    """Tiles ``[start + t * T, start + (t + 1) * T)`` for ``t < count`` (all inside the grid).

    The attributes attend.attend_block reads of every block: ``rows`` [n] (n = count * T, tile
    by tile), ``row_valid`` (None: no padding rows), ``keep`` [n, P] (the pattern on target
    pairs), ``kv_index`` [n, P] and ``relative`` (per-axis rpb indices [n, P])."""

    def __init__(self, problem: Problem, start: int, T: int, count: int, device):
        axis = problem.axes[0]
        L, Dl, K = axis.length, axis.dilation, axis.window
        c_q, c_k = problem.kq_conv_shape
        reach = (c_k - 1) // 2
        self.tiles, self.T = count, T

        def arange(n: int) -> torch.Tensor:
            return torch.arange(n, device=device)

        i = start + arange(count * T).view(count, T)
        first, last = _run_bounds(axis, problem.pattern, i)
        box_lo = first.amin(1, keepdim=True)
        P = int((last.amax(1, keepdim=True) - box_lo).max()) + 1
        # The run starts at the tiles' first key, moved left where it would pass the grid's end;
        # P <= L since every key lies in the grid.
        col0 = torch.minimum(box_lo, torch.full_like(box_lo, L - P))
        cols = col0 + arange(P)  # [c, P]
        self.rows = i.reshape(-1)
        self.row_valid = None
        self.keep = attends(axis, problem.pattern, i[:, :, None], cols[:, None, :]).reshape(count * T, P)
        self.kv_index = cols[:, None, :].expand(count, T, P).reshape(count * T, P)
        relative = (cols // Dl)[:, None, :] - (i // Dl)[:, :, None] + K - 1
        self.relative = [relative.clamp(0, 2 * K - 2).reshape(count * T, P)]
        self.value_columns = cols.reshape(-1)

        # The sources: c_q - 1 rows above each tile, c_k // 2 columns either side of its run;
        # S0 is 0 where a source lies outside the grid or is not attended.
        src_rows = i[:, :1] - (c_q - 1) + arange(T + c_q - 1)  # [c, Tq]
        src_cols = col0 - reach + arange(P + 2 * reach)  # [c, Pk]
        inside = (src_rows >= 0)[:, :, None] & ((src_cols >= 0) & (src_cols < L))[:, None, :]
        self.src_rows = src_rows.clamp(min=0)
        self.src_cols = src_cols.clamp(0, L - 1)
        self.src_keep = inside & attends(axis, problem.pattern, self.src_rows[:, :, None], self.src_cols[:, None, :])

    def mix(self, weights: torch.Tensor, v: torch.Tensor, kv_heads: int) -> torch.Tensor:
        """weights ``[B, n, H, P]`` over each tile's run of values -> ``[B, n, H, D_v]``."""
        B, n, H, P = weights.shape
        w = weights.reshape(B, self.tiles, self.T, kv_heads, H // kv_heads, P)
        v_run = v.index_select(1, self.value_columns).view(B, self.tiles, P, kv_heads, v.shape[-1])
        return torch.einsum("bctkgp,bcpkd->bctkgd", w, v_run).reshape(B, n, H, -1)


def blocks(problem: Problem, device, max_bytes: int):
    """ConvTiles covering the grid in order, each holding at most ``max_bytes`` of S0-sized
    buffers, and at least one tile."""
    L = problem.axes[0].length
    c_q, c_k = problem.kq_conv_shape
    itemsize = 8 if problem.dtype == torch.float64 else 4

    def tile_bytes(T: int, P: int) -> int:
        return BUFFERS * itemsize * problem.batch * problem.heads * (T + c_q - 1) * (P + c_k - 1)

    # The cheapest tiling whose single tile fits the bound (long windows with many heads), else
    # the one with the smallest tile.
    tilings = _tilings(problem.axes[0], problem.pattern, c_q, c_k)
    T, P = next(((T, P) for T, P in tilings if tile_bytes(T, P) <= max_bytes),
                min(tilings, key=lambda tp: tile_bytes(*tp)))  # T <= L
    step = max(1, max_bytes // tile_bytes(T, P))
    whole = L // T
    for first in range(0, whole, step):
        count = min(step, whole - first)
        yield ConvTiles(problem, first * T, T, count, device)
    if L % T:
        yield ConvTiles(problem, whole * T, L % T, 1, device)


def _source_mask_mod(problem: Problem, block: ConvTiles, b, h) -> torch.Tensor:
    """mask_mod on every source pair, as a bool tensor [B, c, H, Tq, Pk] (broadcast)."""
    c, Tq = block.src_rows.shape
    Pk = block.src_cols.shape[1]
    q_idx = block.src_rows.reshape(1, c * Tq, 1, 1)
    kv_idx = block.src_cols[:, None, :].expand(c, Tq, Pk).reshape(1, c * Tq, 1, Pk)
    allowed = problem.apply_mask_mod(b, h, q_idx, kv_idx)
    B, H = problem.batch, problem.heads
    allowed = allowed.expand(B, c * Tq, H, Pk).reshape(B, c, Tq, H, Pk)
    return allowed.permute(0, 1, 3, 2, 4)


def convolved_scores(problem: Problem, inputs: AttentionInputs, block: ConvTiles, b, h) -> torch.Tensor:
    """Target scores after the key-query convolution, ``[B, n, H, P]`` (inputs flattened to
    ``[B, N, heads, dim]`` in the compute dtype)."""
    q, k = inputs.query, inputs.key
    B, _, H, D = q.shape
    Hkv = problem.kv_heads
    G = H // Hkv
    c, Tq = block.src_rows.shape
    Pk = block.src_cols.shape[1]
    c_q, c_k = problem.kq_conv_shape
    q_src = q.index_select(1, block.src_rows.reshape(-1)).view(B, c, Tq, Hkv, G, D)
    k_src = k.index_select(1, block.src_cols.reshape(-1)).view(B, c, Pk, Hkv, D)
    s0 = torch.einsum("bctkgd,bcpkd->bckgtp", q_src, k_src).reshape(B, c, H, Tq, Pk) * problem.scale
    keep = block.src_keep[None, :, None]  # [1, c, 1, Tq, Pk]
    if problem.mask_mod is not None:
        keep = keep & _source_mask_mod(problem, block, b, h)
    s0 = torch.where(keep, s0, torch.zeros((), dtype=s0.dtype, device=s0.device))
    scores = convolve(s0.reshape(B * c, H, Tq, Pk), inputs.kq_conv.to(s0.dtype),
                      cpu_layout=s0.device.type == "cpu")  # [B * c, H, T, P]
    T, P = scores.shape[-2:]
    return scores.reshape(B, c, H, T, P).permute(0, 1, 3, 2, 4).reshape(B, c * T, H, P)


def convolve(s0: torch.Tensor, weight: torch.Tensor, cpu_layout: bool) -> torch.Tensor:
    """Each head's plane of ``s0`` ``[N, H, Tq, Pk]`` cross-correlated with its kernel
    ``weight[h]`` ``[H, c_q, c_k]``: ``[N, H, Tq - c_q + 1, Pk - c_k + 1]``; ``cpu_layout``: in the
    layout CPUs run fastest."""
    N, H, Tq, Pk = s0.shape
    c_q, c_k = weight.shape[1:]
    if cpu_layout:
        # oneDNN's depthwise convolution is several times faster on channels-last inputs: 6.5x
        # forward and 3x backward on a 2-core EPYC at MTA's 6x11 (the copy costs about 1 %)
        return F.conv2d(s0.contiguous(memory_format=torch.channels_last), weight.view(H, 1, c_q, c_k), groups=H)
    # Elsewhere every plane is a channel of its own (at least two), so that CUDA takes PyTorch's
    # depthwise kernel, which multiplies in float32: a convolution that is not depthwise goes to
    # cuDNN, which multiplies float32 in TF32 by default (torch.backends.cudnn.allow_tf32), where
    # the reference computes float32 exactly unless matrix products may use TF32.
    planes = s0.reshape(1, N * H, Tq, Pk)
    kernels = weight.view(H, 1, c_q, c_k).repeat(N, 1, 1, 1)
    if N * H == 1:
        planes = torch.cat([planes, torch.zeros_like(planes)], dim=1)
        kernels = torch.cat([kernels, torch.zeros_like(kernels)])
    out = F.conv2d(planes, kernels, groups=planes.shape[1])
    return out[:, : N * H].reshape(N, H, *out.shape[-2:])

