"""Host side of the Triton backend's forward-mode AD (jvp_kernel): one launch over the forward's
query tiles, with the dQ kernel's tiles (the same walk: a query tile against the key tiles its
windows reach, P from the saved LSE), its tiles fitted to the JVP's own shared memory (tiles.jvp_tiles)."""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from haloattn.backend import AttentionInputs
from haloattn.problem import Problem

from . import batch_slices, tiles
from .fast_launch import Launch, config_key, plan_cache, tensor_layout
from .jvp_kernel import jvp_kernel
from .launch import (_block, _extra_strides, _precision, _rpb_strides, _run_fitted, _start, _tile_constexprs,
                     _unit_last, _walk_constexprs, exact_float32_products, fused_mods, geometry, mod_constexprs,
                     mod_tensors, needs_int64, token_strides)

_JVP_PLANS = plan_cache()


def jvp(problem: Problem, inputs: AttentionInputs, tangents: AttentionInputs, out: torch.Tensor, lse: torch.Tensor,
        config=None) -> Tuple[torch.Tensor, torch.Tensor]:
    if batch_slices.needs_slices(problem):
        return batch_slices.jvp_in_slices(jvp, problem, inputs, tangents, out, lse, config)
    q, k, v, ak, av = (_unit_last(t) for t in (inputs.query, inputs.key, inputs.value, inputs.additional_keys,
                                               inputs.additional_values))
    tq, tk, tv, tak, tav = (_unit_last(t) for t in (tangents.query, tangents.key, tangents.value,
                                                    tangents.additional_keys, tangents.additional_values))
    rpb, trpb = inputs.rpb, tangents.rpb if inputs.rpb is not None else None
    t_out = torch.empty(*q.shape[:-1], problem.value_dim, dtype=q.dtype, device=q.device)
    t_lse = torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)
    config = config or tiles.default_config(problem, exact_float32=exact_float32_products(_precision(q.dtype)))
    mods = fused_mods(problem)
    tensors = dict(q=q, k=k, v=v, tq=tq, tk=tk, tv=tv, rpb=rpb, trpb=trpb, ak=ak, av=av, tak=tak, tav=tav,
                   out=_unit_last(out), lse=lse, t_out=t_out, t_lse=t_lse,
                   **dict(zip(("mod0", "mod1", "mod2", "mod3"), mod_tensors(mods, q))))
    key = (problem, config_key(config), _precision(q.dtype), *(tensor_layout(t) for t in tensors.values()))
    ordered = [t if t is not None else q for t in tensors.values()]
    _run_fitted(_JVP_PLANS, key, problem, config, lambda cfg: _jvp_launch(problem, cfg, tensors, mods),
                lambda launch: _start(launch, *ordered))
    return t_out, t_lse


def _jvp_launch(problem: Problem, config, tensors: dict, mods) -> Launch:
    cfg = tiles.jvp_tiles(problem, tiles.normalise(config, problem)["dq"])
    t = {name: (value if value is not None else tensors["q"]) for name, value in tensors.items()}
    q, k, v = tensors["q"], tensors["k"], tensors["v"]
    B, H, r = problem.batch, problem.heads, problem.rank
    geo = geometry(problem)
    large = needs_int64(q, k, v, t["tq"], t["tk"], t["tv"], t["out"], t["t_out"])
    present = {name: tensors[name] is not None for name in ("tq", "tk", "tv", "trpb", "tak", "tav")}
    return Launch(jvp_kernel, (geo.grid0(cfg["q"]), H, B), [
        *t.values(),
        *token_strides(q, r), *token_strides(k, r), *token_strides(v, r),
        *token_strides(t["tq"], r), *token_strides(t["tk"], r), *token_strides(t["tv"], r),
        *token_strides(tensors["out"], r), *token_strides(tensors["lse"].unsqueeze(-1), r),
        *token_strides(t["t_out"], r),
        *token_strides(tensors["t_lse"].unsqueeze(-1), r),
        *_rpb_strides(tensors["rpb"], r), *_rpb_strides(tensors["trpb"], r),
        *_extra_strides(tensors["ak"]), *_extra_strides(tensors["av"]),
        *_extra_strides(tensors["tak"]), *_extra_strides(tensors["tav"]),
        H // problem.kv_heads, problem.extra_tokens, problem.head_dim, problem.value_dim,
        *geo.runtime_args(cfg["q"]), problem.scale, problem.softcap or 1.0,
    ], dict(
        **geo.constexprs(), **_tile_constexprs(cfg["q"], cfg["kv"], r),
        BLOCK_D=_block(problem.head_dim), BLOCK_DV=tiles.value_block(problem),
        HAS_RPB=tensors["rpb"] is not None, HAS_SOFTCAP=problem.softcap is not None,
        HAS_EXTRA=tensors["ak"] is not None,
        T_Q=present["tq"], T_K=present["tk"], T_V=present["tv"], T_RPB=present["trpb"],
        T_AK=present["tak"], T_AV=present["tav"],
        LARGE=large, PRECISION=_precision(q.dtype), RANK=r, **_walk_constexprs(cfg),
        **mod_constexprs(problem, mods, large, gradient=True), num_warps=cfg["warps"], num_stages=cfg["stages"],
    ))
