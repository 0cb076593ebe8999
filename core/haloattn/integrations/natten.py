"""NATTEN's functional API on haloattn: change the import, keep the calls.

NATTEN 0.20 removed its unfused ops (``na2d_qk`` / ``na2d_av``, and the older ``natten2dqkrpb`` /
``natten2dav``), which broke models built on them (NAT and DiNAT in HF transformers, ComfyUI
nodes), and each NATTEN release needs a build matched to the installed torch. This module offers
both APIs on every device haloattn runs on::

    from haloattn.integrations.natten import natten2dqkrpb, natten2dav   # was: natten.functional
    from haloattn.integrations import natten                             # natten.na2d(...)

* Fused, heads-last ``na1d`` / ``na2d`` / ``na3d`` (NATTEN >= 0.20's arguments, and 0.17's
  ``rpb``): one :func:`haloattn.attention` call, so the fused backends run it. Everything after
  ``kernel_size`` is keyword-only (NATTEN 0.17 and 0.20 put ``dilation`` and ``stride`` in that
  place, so a positional one would be read differently by one of them). NATTEN's performance
  options (``backend``, tile shapes, ``kernel_schedule``, ``torch_compile``, ...) are accepted and
  change nothing: haloattn picks and tunes its own kernels. Any other keyword is an error.
* Unfused, heads-first ``na{1,2,3}d_qk`` / ``na{1,2,3}d_av`` (NATTEN 0.15-0.17) and the older
  ``natten{1,2,3}dqk[rpb]`` / ``natten{1,2,3}dav``: the attention weights are materialised,
  ``[B, H, *spatial, prod(kernel_size)]`` followed by one weight per additional token, slot ``s``
  of a query being the ``s``-th key of its neighbourhood in row-major order (NATTEN's layout).
  Keys and values are gathered a few slots at a time, so memory stays at a few query-sized
  buffers, never ``prod(kernel_size)`` copies of the keys; backward and forward-mode (JVP) rules
  are explicit. Causal windows are not offered unfused (NATTEN's slot layout for their missing
  keys is not reproduced here): ``na*d`` and :func:`haloattn.attention` take ``causal``.
* ``merge_attentions``.
* ``patch_natten(model)``: NATTEN's own modules (``NeighborhoodAttention{1,2,3}D``) in a model run
  their attention on haloattn, in place, with their own parameters.
"""

from __future__ import annotations

import functools
import math
from typing import Sequence

import torch
from torch.autograd.function import once_differentiable

from ..api import attention
from ..api import merge_attentions as _merge_attentions
from ..geometry import Axis, key_range
from ..problem import build_problem

__all__ = [
    "na1d", "na2d", "na3d", "na1d_qk", "na2d_qk", "na3d_qk", "na1d_av", "na2d_av", "na3d_av",
    "natten1dqkrpb", "natten2dqkrpb", "natten3dqkrpb", "natten1dqk", "natten2dqk", "natten3dqk",
    "natten1dav", "natten2dav", "natten3dav", "merge_attentions", "patch_natten",
]

# NATTEN's keywords that choose or tune its kernels and do not change the result.
PERFORMANCE_OPTIONS = frozenset({
    "attention_kwargs", "backend", "q_tile_shape", "kv_tile_shape", "backward_q_tile_shape",
    "backward_kv_tile_shape", "backward_kv_splits", "backward_use_pt_reduction", "run_persistent_kernel",
    "kernel_schedule", "torch_compile", "try_fuse_additional_kv",
})

# Gathered keys or values per step of the unfused ops (bytes): a few query-sized buffers.
GATHER_STEP_BYTES = 64 * 2**20


# -- fused ------------------------------------------------------------------------------------------

def _fused(rank: int, name: str, query, key, value, kernel_size, stride, dilation, is_causal, scale,
           additional_keys, additional_values, rpb, return_lse, options):
    unknown = sorted(set(options) - PERFORMANCE_OPTIONS)
    if unknown:
        raise TypeError(f"{name}() got unexpected keyword arguments {unknown}; NATTEN's performance options "
                        f"{sorted(PERFORMANCE_OPTIONS)} are accepted (and have no effect here)")
    if isinstance(query, torch.Tensor) and query.dim() != rank + 3:
        raise ValueError(f"{name} takes [B, *spatial, H, D] tensors with {rank} spatial axes (rank {rank + 3}); "
                         f"query has shape {tuple(query.shape)}")
    return attention(query, key, value, kernel_size, stride=stride, dilation=dilation, causal=is_causal, scale=scale,
                     rpb=rpb, additional_keys=additional_keys, additional_values=additional_values,
                     return_lse=return_lse)


def na1d(query, key, value, kernel_size, *, stride=1, dilation=1, is_causal=False, scale=None, additional_keys=None,
         additional_values=None, rpb=None, return_lse=False, **natten_options):
    """NATTEN's ``na1d`` (heads-last ``[B, L, H, D]``): :func:`haloattn.attention` on a 1-D grid."""
    return _fused(1, "na1d", query, key, value, kernel_size, stride, dilation, is_causal, scale, additional_keys,
                  additional_values, rpb, return_lse, natten_options)


def na2d(query, key, value, kernel_size, *, stride=1, dilation=1, is_causal=False, scale=None, additional_keys=None,
         additional_values=None, rpb=None, return_lse=False, **natten_options):
    """NATTEN's ``na2d`` (heads-last ``[B, X, Y, H, D]``): :func:`haloattn.attention` on a 2-D grid."""
    return _fused(2, "na2d", query, key, value, kernel_size, stride, dilation, is_causal, scale, additional_keys,
                  additional_values, rpb, return_lse, natten_options)


def na3d(query, key, value, kernel_size, *, stride=1, dilation=1, is_causal=False, scale=None, additional_keys=None,
         additional_values=None, rpb=None, return_lse=False, **natten_options):
    """NATTEN's ``na3d`` (heads-last ``[B, X, Y, Z, H, D]``): :func:`haloattn.attention` on a 3-D grid."""
    return _fused(3, "na3d", query, key, value, kernel_size, stride, dilation, is_causal, scale, additional_keys,
                  additional_values, rpb, return_lse, natten_options)


def merge_attentions(outputs: Sequence[torch.Tensor], lse_tensors: Sequence[torch.Tensor], torch_compile: bool = True,
                     use_autograd_fix: bool = True):
    """NATTEN's ``merge_attentions``: :func:`haloattn.merge_attentions` (its two options change
    nothing here)."""
    return _merge_attentions(outputs, lse_tensors)


# -- unfused: the neighbourhood of every query, slot by slot ------------------------------------------

def _slots(spatial: Sequence[int], kernel: Sequence[int], dilation: Sequence[int], device):
    """``(keys, relative)``: the flat index of each query's keys, ``[N, prod(kernel)]`` in NATTEN's
    slot order (row-major over the window), and per axis the rpb index of each (query, slot),
    broadcastable to ``[*spatial, *kernel]``."""
    rank = len(spatial)
    flat = torch.zeros((), dtype=torch.long, device=device)
    relative = []
    for a, (length, k, dil) in enumerate(zip(spatial, kernel, dilation)):
        coords = torch.arange(length, device=device)
        group, lo, _ = key_range(Axis(length, k, dilation=dil), "neighborhood", coords)
        keys = (lo[:, None] + torch.arange(k, device=device)) * dil + group[:, None]  # [L, K]
        shape = [1] * (2 * rank)
        shape[a], shape[rank + a] = length, k
        flat = flat * length + keys.view(shape)
        relative.append((keys // dil - (coords // dil)[:, None] + k - 1).view(shape))
    return flat.reshape(math.prod(spatial), math.prod(kernel)), relative


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _steps(index: torch.Tensor, rows: torch.Tensor):
    """Slot ranges whose gathered rows (``rows``: ``[B, H, N, C]``) stay near GATHER_STEP_BYTES."""
    per_slot = max(1, rows.numel() * 4)
    step = max(1, GATHER_STEP_BYTES // per_slot)
    return [(s, min(s + step, index.shape[1])) for s in range(0, index.shape[1], step)]


def _gather(rows: torch.Tensor, index: torch.Tensor, start: int, stop: int, dtype) -> torch.Tensor:
    """``rows[:, :, index[:, start:stop]]`` as ``[B, H, N, slots, C]`` in ``dtype``."""
    b, h, _, c = rows.shape
    picked = rows.index_select(2, index[:, start:stop].reshape(-1))
    return picked.view(b, h, index.shape[0], stop - start, c).to(dtype)


def _dots(a: torch.Tensor, b: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``out[..., n, s] = <a[..., n, :], b[..., index[n, s], :]>`` (the QK product)."""
    dtype = _compute_dtype(a.dtype)
    a = a.to(dtype)
    out = a.new_empty(*a.shape[:-1], index.shape[1])
    for start, stop in _steps(index, b):
        out[..., start:stop] = torch.einsum("bhnc,bhnsc->bhns", a, _gather(b, index, start, stop, dtype))
    return out


def _weighted(w: torch.Tensor, b: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``out[..., n, :] = sum_s w[..., n, s] b[..., index[n, s], :]`` (the AV product)."""
    dtype = _compute_dtype(b.dtype)
    w = w.to(dtype)
    out = w.new_zeros(*w.shape[:-1], b.shape[-1])
    for start, stop in _steps(index, b):
        out += torch.einsum("bhns,bhnsc->bhnc", w[..., start:stop], _gather(b, index, start, stop, dtype))
    return out


def _scattered(w: torch.Tensor, a: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``out[..., m, :] = sum over (n, s) with index[n, s] = m of w[..., n, s] a[..., n, :]``: the
    gradient that flows back to the gathered side of either product."""
    dtype = _compute_dtype(a.dtype)
    w, a = w.to(dtype), a.to(dtype)
    b, h, n, c = a.shape
    out = a.new_zeros(b, h, n, c)
    for start, stop in _steps(index, a):
        parts = torch.einsum("bhns,bhnc->bhnsc", w[..., start:stop], a)
        out.index_add_(2, index[:, start:stop].reshape(-1), parts.reshape(b, h, -1, c))
    return out


class _NeighbourhoodQK(torch.autograd.Function):
    """``[B, H, N, D]`` queries and keys -> ``[B, H, N, slots]`` dot products (compute dtype)."""

    @staticmethod
    def forward(q, k, index):
        return _dots(q, k, index)

    @staticmethod
    def setup_context(ctx, inputs, output):  # the form torch.func's transforms (jvp) take
        q, k, ctx.index = inputs
        ctx.save_for_backward(q, k)
        ctx.save_for_forward(q, k)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        q, k = ctx.saved_tensors
        dq = _weighted(grad, k, ctx.index).to(q.dtype) if ctx.needs_input_grad[0] else None
        dk = _scattered(grad, q, ctx.index).to(k.dtype) if ctx.needs_input_grad[1] else None
        return dq, dk, None

    @staticmethod
    def jvp(ctx, dq, dk, _):
        q, k = ctx.saved_tensors
        out = 0
        if dq is not None:
            out = out + _dots(dq, k, ctx.index)
        if dk is not None:
            out = out + _dots(q, dk, ctx.index)
        return out


class _NeighbourhoodAV(torch.autograd.Function):
    """``[B, H, N, slots]`` weights and ``[B, H, N, D_v]`` values -> ``[B, H, N, D_v]`` (compute dtype)."""

    @staticmethod
    def forward(w, v, index):
        return _weighted(w, v, index)

    @staticmethod
    def setup_context(ctx, inputs, output):  # the form torch.func's transforms (jvp) take
        w, v, ctx.index = inputs
        ctx.save_for_backward(w, v)
        ctx.save_for_forward(w, v)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        w, v = ctx.saved_tensors
        dw = _dots(grad, v, ctx.index).to(w.dtype) if ctx.needs_input_grad[0] else None
        dv = _scattered(w, grad, ctx.index).to(v.dtype) if ctx.needs_input_grad[1] else None
        return dw, dv, None

    @staticmethod
    def jvp(ctx, dw, dv, _):
        w, v = ctx.saved_tensors
        out = 0
        if dw is not None:
            out = out + _weighted(dw, v, ctx.index)
        if dv is not None:
            out = out + _weighted(w, dv, ctx.index)
        return out


def _unfused_problem(name: str, rank: int, tokens: torch.Tensor, other: torch.Tensor, kernel_size, dilation,
                     is_causal):
    """Check the unfused call as haloattn checks its own (on heads-last views), returning the
    per-axis windows and dilations."""
    if not isinstance(tokens, torch.Tensor) or tokens.dim() != rank + 3:
        shape = tuple(tokens.shape) if isinstance(tokens, torch.Tensor) else type(tokens).__name__
        raise ValueError(f"{name} takes heads-first [B, H, *spatial, D] tensors with {rank} spatial axes "
                         f"(rank {rank + 3}); got {shape}")
    causal = (is_causal,) * rank if isinstance(is_causal, bool) else tuple(is_causal)
    if any(causal):
        raise NotImplementedError(
            f"{name}: causal windows are not offered by the unfused ops here (NATTEN's slot layout for their "
            "missing keys is not reproduced); haloattn.integrations.natten.na{1,2,3}d and haloattn.attention take "
            "is_causal / causal")
    heads_last = tokens.detach().movedim(1, -2)
    problem = build_problem(heads_last, other.detach().movedim(1, -2), other.detach().movedim(1, -2), kernel_size,
                            dilation=dilation)
    return tuple(a.window for a in problem.axes), tuple(a.dilation for a in problem.axes)


def _qk(name, rank, query, key, kernel_size, dilation, additional_keys, is_causal, rpb):
    if isinstance(query, torch.Tensor) and isinstance(key, torch.Tensor) and query.shape != key.shape:
        raise ValueError(f"{name}: query {tuple(query.shape)} and key {tuple(key.shape)} must have one shape")
    kernel, dilations = _unfused_problem(name, rank, query, key, kernel_size, dilation, is_causal)
    b, h, *spatial, d = query.shape
    index, relative = _slots(spatial, kernel, dilations, query.device)
    attn = _NeighbourhoodQK.apply(query.reshape(b, h, -1, d), key.reshape(b, h, -1, d), index)
    if rpb is not None:
        want = (h, *(2 * k - 1 for k in kernel))
        if tuple(rpb.shape) != want:
            raise ValueError(f"{name}: rpb has shape {tuple(rpb.shape)}; expected {want} ([H, 2K-1 per axis])")
        attn = attn + rpb.to(attn.dtype)[(slice(None), *relative)].reshape(h, *attn.shape[2:])
    if additional_keys is not None:
        if additional_keys.dim() != 4 or additional_keys.shape[:2] != (b, h) or additional_keys.shape[-1] != d:
            raise ValueError(f"{name}: additional_keys has shape {tuple(additional_keys.shape)}; expected "
                             f"[B, H, E, D] = [{b}, {h}, E, {d}]")
        extra = torch.einsum("bhnd,bhed->bhne", query.reshape(b, h, -1, d).to(attn.dtype), additional_keys.to(attn.dtype))
        attn = torch.cat([attn, extra], dim=-1)
    return attn.to(query.dtype).reshape(b, h, *spatial, attn.shape[-1])


def _av(name, rank, attn, value, kernel_size, dilation, additional_values, is_causal):
    kernel, dilations = _unfused_problem(name, rank, value, value, kernel_size, dilation, is_causal)
    b, h, *spatial, dv = value.shape
    slots = math.prod(kernel)
    extra = 0 if additional_values is None else additional_values.shape[-2]
    want = (b, h, *spatial, slots + extra)
    if tuple(attn.shape) != want:
        raise ValueError(f"{name}: attn has shape {tuple(attn.shape)}; expected {want} ([B, H, *spatial, "
                         f"prod(kernel_size) + additional tokens])")
    if additional_values is not None and (additional_values.dim() != 4 or additional_values.shape[:2] != (b, h)
                                          or additional_values.shape[-1] != dv):
        raise ValueError(f"{name}: additional_values has shape {tuple(additional_values.shape)}; expected "
                         f"[B, H, E, D_v] = [{b}, {h}, E, {dv}]")
    index, _ = _slots(spatial, kernel, dilations, value.device)
    weights = attn.reshape(b, h, -1, slots + extra)
    out = _NeighbourhoodAV.apply(weights[..., :slots], value.reshape(b, h, -1, dv), index)
    if additional_values is not None:
        out = out + torch.einsum("bhne,bhed->bhnd", weights[..., slots:].to(out.dtype), additional_values.to(out.dtype))
    return out.to(value.dtype).reshape(b, h, *spatial, dv)


def na1d_qk(query, key, kernel_size, dilation=1, additional_keys=None, is_causal=False, rpb=None):
    """NATTEN 0.15-0.17's ``na1d_qk``: ``[B, H, L, D]`` -> weights ``[B, H, L, K (+ E)]``."""
    return _qk("na1d_qk", 1, query, key, kernel_size, dilation, additional_keys, is_causal, rpb)


def na2d_qk(query, key, kernel_size, dilation=1, additional_keys=None, is_causal=False, rpb=None):
    """NATTEN 0.15-0.17's ``na2d_qk``: ``[B, H, X, Y, D]`` -> weights ``[B, H, X, Y, K0*K1 (+ E)]``."""
    return _qk("na2d_qk", 2, query, key, kernel_size, dilation, additional_keys, is_causal, rpb)


def na3d_qk(query, key, kernel_size, dilation=1, additional_keys=None, is_causal=False, rpb=None):
    """NATTEN 0.15-0.17's ``na3d_qk``: ``[B, H, X, Y, Z, D]`` -> ``[B, H, X, Y, Z, K0*K1*K2 (+ E)]``."""
    return _qk("na3d_qk", 3, query, key, kernel_size, dilation, additional_keys, is_causal, rpb)


def na1d_av(attn, value, kernel_size, dilation=1, additional_values=None, is_causal=False):
    """NATTEN 0.15-0.17's ``na1d_av``: weights and ``[B, H, L, D_v]`` values -> ``[B, H, L, D_v]``."""
    return _av("na1d_av", 1, attn, value, kernel_size, dilation, additional_values, is_causal)


def na2d_av(attn, value, kernel_size, dilation=1, additional_values=None, is_causal=False):
    """NATTEN 0.15-0.17's ``na2d_av``: weights and ``[B, H, X, Y, D_v]`` values -> the same shape."""
    return _av("na2d_av", 2, attn, value, kernel_size, dilation, additional_values, is_causal)


def na3d_av(attn, value, kernel_size, dilation=1, additional_values=None, is_causal=False):
    """NATTEN 0.15-0.17's ``na3d_av``: weights and ``[B, H, X, Y, Z, D_v]`` values -> the same shape."""
    return _av("na3d_av", 3, attn, value, kernel_size, dilation, additional_values, is_causal)


# NATTEN <= 0.14's names (one kernel size and dilation for every axis; 3-D: the depth axis apart).
def natten1dqkrpb(query, key, rpb, kernel_size, dilation):
    return na1d_qk(query, key, kernel_size, dilation, rpb=rpb)


def natten2dqkrpb(query, key, rpb, kernel_size, dilation):
    return na2d_qk(query, key, kernel_size, dilation, rpb=rpb)


def natten3dqkrpb(query, key, rpb, kernel_size_d, kernel_size, dilation_d, dilation):
    return na3d_qk(query, key, (kernel_size_d, kernel_size, kernel_size), (dilation_d, dilation, dilation), rpb=rpb)


def natten1dqk(query, key, kernel_size, dilation):
    return na1d_qk(query, key, kernel_size, dilation)


def natten2dqk(query, key, kernel_size, dilation):
    return na2d_qk(query, key, kernel_size, dilation)


def natten3dqk(query, key, kernel_size_d, kernel_size, dilation_d, dilation):
    return na3d_qk(query, key, (kernel_size_d, kernel_size, kernel_size), (dilation_d, dilation, dilation))


def natten1dav(attn, value, kernel_size, dilation):
    return na1d_av(attn, value, kernel_size, dilation)


def natten2dav(attn, value, kernel_size, dilation):
    return na2d_av(attn, value, kernel_size, dilation)


def natten3dav(attn, value, kernel_size_d, kernel_size, dilation_d, dilation):
    return na3d_av(attn, value, (kernel_size_d, kernel_size, kernel_size), (dilation_d, dilation, dilation))


# -- NATTEN's modules -------------------------------------------------------------------------------

NATTEN_MODULES = ("NeighborhoodAttention1D", "NeighborhoodAttention2D", "NeighborhoodAttention3D")


def _natten_module_forward(module, x: torch.Tensor) -> torch.Tensor:
    """NATTEN's ``NeighborhoodAttention{1,2,3}D.forward`` (``x``: ``[B, *spatial, C]``) as one
    haloattn call on the module's own ``qkv``, ``rpb``, scale and ``proj``."""
    q, k, v = module.qkv(x).unflatten(-1, (3, module.num_heads, module.head_dim)).unbind(-3)
    out = attention(q, k, v, module.kernel_size, stride=getattr(module, "stride", 1),
                    dilation=getattr(module, "dilation", None) or 1, causal=getattr(module, "is_causal", False),
                    scale=module.scale, rpb=getattr(module, "rpb", None))
    return module.proj_drop(module.proj(out.flatten(-2)))


def _attention_dropout(module) -> float:
    rate = getattr(module, "attn_drop_rate", None)  # NATTEN >= 0.15
    if rate is None:
        rate = getattr(getattr(module, "attn_drop", None), "p", 0.0)  # older modules keep the Dropout only
    return float(rate or 0.0)


def patch_natten(model: torch.nn.Module) -> torch.nn.Module:
    """Make every NATTEN ``NeighborhoodAttention{1,2,3}D`` module of ``model`` run on haloattn.

    Patches each module's ``forward`` in place (parameters, ``state_dict`` and the module tree stay
    as they are; NATTEN itself is not imported) and returns ``model``. Raises ``ValueError`` when
    ``model`` has no such module or one has attention dropout, which haloattn does not have. An
    input smaller than ``kernel_size * dilation`` on an axis is then an error, where NATTEN <= 0.14's
    modules padded it.
    """
    modules = [m for m in model.modules()
               if type(m).__name__ in NATTEN_MODULES and type(m).__module__.startswith("natten")]
    if not modules:
        raise ValueError(f"{type(model).__name__} has no NATTEN NeighborhoodAttention1D/2D/3D module to patch")
    for module in modules:  # all checked before any is patched: a refused model stays as it was
        rate = _attention_dropout(module)
        if rate > 0:
            raise ValueError(f"a NATTEN {type(module).__name__} has attention dropout {rate}; haloattn has none "
                             "(build it with attn_drop=0)")
    for module in modules:
        # A partial, not types.MethodType: pickle stores a bound method by its name on the module,
        # which a loaded module does not have (torch.save of the whole model then failed to load).
        module.forward = functools.partial(_natten_module_forward, module)
    return model
