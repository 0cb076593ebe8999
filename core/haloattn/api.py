"""The public entry points: attention(), explain(), merge_attentions(), backends()."""

from __future__ import annotations

import functools
import math
import os
from typing import Callable, Optional, Sequence

import torch
from torch.autograd import forward_ad

from . import flop_count, ops, sharding, tracing
from .backend import AttentionInputs, Backend, checked_outputs, on_device
from .dispatch import BACKEND_ENV, DISPATCHER, Explanation
from .problem import build_problem, cache_key, check_mods
from .tuning import AUTOTUNE_ENV, CACHE_DIR_ENV

# Steady-state calls skip validation and dispatch: a dict keyed on everything they depend on.
_CALLS: dict = {}
_CALLS_LIMIT = 4096


def _kept(call_key):
    """(the kept entry of ``call_key`` or None, the key; None for a key that is not hashable, which
    validation then names)."""
    try:
        return _CALLS.get(call_key), call_key
    except TypeError:
        return None, None


def _tuning_environment() -> tuple:
    """The environment a call's dispatch depends on: a forced backend, autotuning, and the tuning
    cache (a different one may pick a different config)."""
    return os.environ.get(BACKEND_ENV), os.environ.get(AUTOTUNE_ENV), os.environ.get(CACHE_DIR_ENV)


def _remember(call_key, entry) -> None:
    """Keep a call's (problem, backend, config) under its key (None: not hashable, not kept)."""
    if call_key is not None:
        if len(_CALLS) >= _CALLS_LIMIT:
            _CALLS.clear()
        _CALLS[call_key] = entry


_OPTION_NAMES = (
    "window", "stride", "dilation", "causal", "pattern", "shift", "scale", "softcap",
    "score_mod", "mask_mod", "return_lse", "backend",
)


def _hashable(value):
    return tuple(value) if isinstance(value, list) else value


def _dispatches_itself(t: torch.Tensor) -> bool:
    """A tensor subclass with its own __torch_dispatch__ (a FakeTensor, say), which has to meet
    the custom op rather than a backend's kernels."""
    return type(t).__torch_dispatch__ is not torch.Tensor.__torch_dispatch__


def _tensor_key(t: Optional[torch.Tensor]):
    return None if t is None else (t.shape, t.dtype, t.device)


_functorch = getattr(torch._C, "_functorch", None)
# functorch's wrapper test (torch.func transforms wrap their inputs); private, so looked up once.
_is_wrapped = getattr(_functorch, "is_functorch_wrapped_tensor", lambda t: False)


def _forward_ad_active() -> bool:
    """Whether a forward-mode AD level is open (``torch.autograd.forward_ad.dual_level``, which
    ``torch.func.jvp`` opens too): a module attribute read. A torch without that attribute is
    assumed to have one open (then every call looks for tangents)."""
    return getattr(forward_ad, "_current_level", 0) >= 0


def _transform_stack() -> set:
    """Names of the torch.func transforms the call runs under ('Jvp', 'Grad', 'Vmap', ...). A
    torch whose functorch internals differ reports 'Jvp' (so a JVP-capable backend is chosen)."""
    try:
        stack = _functorch.get_interpreter_stack() or []
        return {interpreter.key().name for interpreter in stack}
    except AttributeError:
        return {"Jvp"}


def _transforms(tensors):
    """(runs under forward-mode AD or a torch.func transform, needs a JVP rule). Checked before
    anything else reads the tensors: about a microsecond a call without any.

    Tangents (``forward_ad`` duals, ``torch.func.jvp``) need a backend with a JVP rule, which the
    dispatcher then picks."""
    tangents = _forward_ad_active()
    transformed = needs_jvp = False
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            continue
        if tangents and forward_ad.unpack_dual(t).tangent is not None:
            transformed = needs_jvp = True
        elif _is_wrapped(t):
            transformed = True
    if transformed and not needs_jvp:
        needs_jvp = "Jvp" in _transform_stack()
    return transformed, needs_jvp


def attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    window,
    *,
    stride=1,
    dilation=1,
    causal=False,
    pattern: str = "neighborhood",
    shift=0,
    scale: Optional[float] = None,
    softcap: Optional[float] = None,
    rpb: Optional[torch.Tensor] = None,
    score_mod: Optional[Callable] = None,
    mask_mod: Optional[Callable] = None,
    kq_conv: Optional[torch.Tensor] = None,
    additional_keys: Optional[torch.Tensor] = None,
    additional_values: Optional[torch.Tensor] = None,
    return_lse: bool = False,
    backend: Optional[str] = None,
):
    """Local attention over a 1-D, 2-D or 3-D token grid, exactly as SEMANTICS.md defines it.

    Args:
        query: ``[B, *spatial, H, D]``. key: ``[B, *spatial, H_kv, D]``. value: ``[B, *spatial, H_kv, D_v]``.
        window: keys per axis (int, or one per spatial axis).
        stride, dilation, causal, shift: per axis (an int/bool broadcasts to every axis).
        pattern: ``"neighborhood"`` (NATTEN's generalized neighbourhood) or ``"window"`` (Swin).
        scale: score scale, default ``D ** -0.5`` (0.0 is honoured).
        softcap: ``softcap * tanh(s / softcap)`` on every score.
        rpb: relative position bias ``[H, 2K1-1, (2K2-1), (2K3-1)]`` (NATTEN's orientation).
        score_mod, mask_mod: FlexAttention-style functions of flat token indices.
        kq_conv: Multi-Token-Attention key-query convolution ``[H, c_q, c_k]`` (rank 1).
        additional_keys, additional_values: ``[B, E, H_kv, D]`` / ``[B, E, H_kv, D_v]`` tokens
            every query attends to in the same softmax.
        return_lse: also return the natural-log LSE ``[B, *spatial, H]`` (float32; float64 for
            float64 inputs).
        backend: force a backend by name (or a comma list in priority order).

    Returns:
        ``[B, *spatial, H, D_v]``, or ``(output, lse)`` with ``return_lse=True``.
    """
    tensors = _autocast((query, key, value, rpb, kq_conv, additional_keys, additional_values))
    query, key, value, rpb, kq_conv, additional_keys, additional_values = tensors
    compiling = torch.compiler.is_compiling()
    plain = type(query) is torch.Tensor  # not a subclass (DTensor, FakeTensor, Parameter)
    if not compiling and not plain and sharding.is_dtensor(query):
        # Each rank runs its shards through the plain call below (sharding.py), its mods seeing
        # global batch and head indices (``mods`` shifts them by the shard's first ones).
        def local_call(q, k, v, local_rpb, local_kq_conv, local_keys, local_values, mods):
            check_mods(score_mod, mask_mod)  # named errors before the shifted mods' cache hashes them
            local_score_mod, local_mask_mod = mods(score_mod, mask_mod)
            return attention(q, k, v, window, stride=stride, dilation=dilation, causal=causal, pattern=pattern,
                             shift=shift, scale=scale, softcap=softcap, rpb=local_rpb, score_mod=local_score_mod,
                             mask_mod=local_mask_mod, kq_conv=local_kq_conv, additional_keys=local_keys,
                             additional_values=local_values, return_lse=True, backend=backend)

        return sharding.attention(tensors, local_call, return_lse)
    if torch.jit.is_tracing():  # TorchScript's tracer: torch operations only (tracing.py)
        out, lse = tracing.attention(tensors, dict(
            window=window, stride=stride, dilation=dilation, causal=causal, pattern=pattern, shift=shift,
            scale=scale, softcap=softcap, score_mod=score_mod, mask_mod=mask_mod, return_lse=return_lse), backend)
        return (out, lse) if return_lse else out
    if not compiling:
        transformed, needs_jvp = _transforms(tensors)
        if transformed:
            return _transformed_call(tensors, needs_jvp, dict(
                window=window, stride=stride, dilation=dilation, causal=causal, pattern=pattern, shift=shift,
                scale=scale, softcap=softcap, score_mod=score_mod, mask_mod=mask_mod, return_lse=return_lse,
            ), backend)
    # The custom op while torch.compile traces, and where something watches the dispatch (a
    # FlopCounterMode, a FakeTensorMode), there is no data (meta tensors: shape inference, models
    # initialised on the meta device) or the tensors dispatch themselves (a FakeTensor outside
    # its mode): its fake implementation validates the call and gives the output shapes, and
    # flop_count gives the FLOPs.
    watched = not compiling and (
        torch._C._len_torch_dispatch_stack() > 0
        or (isinstance(query, torch.Tensor) and (query.is_meta or (not plain and _dispatches_itself(query)))))
    if compiling or watched:
        if watched:
            flop_count.count_with_active_counters()
        options = dict(zip(_OPTION_NAMES, (
            _hashable(window), _hashable(stride), _hashable(dilation), _hashable(causal), pattern,
            _hashable(shift), scale, softcap, score_mod, mask_mod, return_lse, backend,
        )))
        out, lse = ops.compiled_attention(tensors, options)
        return (out, lse) if return_lse else out
    if not all(t is None or isinstance(t, torch.Tensor) for t in tensors):
        # not a tensor: let validation name the argument (the cache key would raise AttributeError)
        build_problem(
            query, key, value, window, rpb=rpb, kq_conv=kq_conv, additional_keys=additional_keys,
            additional_values=additional_values,
        )
    needs_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)
    call_key = (
        _tensor_key(query), _tensor_key(key), _tensor_key(value), _tensor_key(rpb), _tensor_key(kq_conv),
        _tensor_key(additional_keys), _tensor_key(additional_values),
        # typed keys (problem.cache_key): after window=3, window=3.0 (equal, one hash) must still be refused
        cache_key(window), cache_key(stride), cache_key(dilation), cache_key(causal), pattern,
        cache_key(shift), cache_key(scale), cache_key(softcap), score_mod, mask_mod, cache_key(return_lse), backend,
        needs_grad, torch.is_grad_enabled(), *_tuning_environment(),
    )
    entry, call_key = _kept(call_key)
    first = entry is None  # a backend's first result per signature is checked against the contract
    if first:
        problem = build_problem(
            query, key, value, window, stride=stride, dilation=dilation, causal=causal, pattern=pattern,
            shift=shift, scale=scale, softcap=softcap, rpb=rpb, score_mod=score_mod, mask_mod=mask_mod,
            kq_conv=kq_conv, additional_keys=additional_keys, additional_values=additional_values,
            return_lse=return_lse,
        )
        chosen, config = DISPATCHER.select(problem, backend, AttentionInputs(*tensors), needs_grad)
        entry = (problem, chosen, config)
        _remember(call_key, entry)
    problem, chosen, config = entry
    if needs_grad:
        result = ops.AttentionFunction.apply(problem, chosen, config, *tensors)
    else:
        with on_device(query.device):
            result = chosen.forward(problem, AttentionInputs(*tensors), config)
    out, lse = checked_outputs(chosen, AttentionInputs(*tensors), result) if first else result
    return (out, lse) if return_lse else out


# Autocast casts the token tensors (query, key, value, additional keys and values), not the learned
# tables (rpb, kq_conv), which may stay float32 beside 16-bit tokens.
_TOKEN_TENSORS = (0, 1, 2, 5, 6)
_AUTOCAST_ELIGIBLE = (torch.float32, torch.float16, torch.bfloat16)


@ops.assume_constant_result
def _autocast_available(device_type: str) -> bool:
    """torch.amp.is_autocast_available, a constant for compiled code (fixed per device type):
    torch 2.11's dynamo cannot trace the call, and a fullgraph compile of any model calling
    attention() failed on it (2026-11-29, H200; torch 2.13 traces it)."""
    return torch.amp.is_autocast_available(device_type)


def _autocast(tensors):
    """The call's tensors as torch.autocast casts F.scaled_dot_product_attention's: inside an
    autocast region for the query's device, token tensors in float32 (or the other 16-bit type)
    become autocast's dtype, so that a float32 query (after a float32 rotary embedding, say) beside
    bfloat16 keys and values runs in bfloat16 as SDPA would; float64 is left alone, as autocast
    leaves it. Outside autocast the inputs' own dtypes decide (and must agree)."""
    query = tensors[0]
    if not isinstance(query, torch.Tensor):
        return tensors
    device_type = query.device.type
    if not (_autocast_available(device_type) and torch.is_autocast_enabled(device_type)):
        return tensors
    dtype = torch.get_autocast_dtype(device_type)
    return tuple(t.to(dtype) if i in _TOKEN_TENSORS and isinstance(t, torch.Tensor) and t.dtype in _AUTOCAST_ELIGIBLE
                 else t for i, t in enumerate(tensors))


def _transformed_call(tensors, needs_jvp: bool, options: dict, backend: Optional[str]):
    """A call under forward-mode AD or a torch.func transform, through the torch.func form of the
    autograd function; validated and dispatched once per signature, as plain calls are (the
    logical shapes a transform shows key it like real tensors)."""
    entry, call_key = _kept(("transformed", needs_jvp, backend, *(_tensor_key(t) for t in tensors),
                             *(cache_key(v) for v in options.values()), *_tuning_environment()))
    if entry is None:
        query, key, value, rpb, kq_conv, additional_keys, additional_values = tensors
        problem = build_problem(
            query, key, value, rpb=rpb, kq_conv=kq_conv, additional_keys=additional_keys,
            additional_values=additional_values, **options,
        )
        entry = (problem, *DISPATCHER.select(problem, backend, None, needs_grad=True, needs_jvp=needs_jvp))
        _remember(call_key, entry)
    problem, chosen, config = entry
    out, lse = ops.TransformableAttentionFunction.apply(problem, chosen, config, *tensors)
    return (out, lse) if options["return_lse"] else out


def explain(
    query, key, value, window, *, backend: Optional[str] = None, verbose: bool = True, jvp: bool = False, **kwargs
) -> Explanation:
    """Every backend's verdict for this call (same arguments as :func:`attention`), and which one
    would run. ``jvp=True``: for a call carrying tangents (forward-mode AD), which only backends
    with a JVP rule run. Prints the table unless ``verbose=False``; always returns it."""
    problem = build_problem(query, key, value, window, **kwargs)
    explanation = DISPATCHER.explain(problem, backend, needs_jvp=jvp)
    if verbose:
        print(explanation)
    return explanation


def register_backend(backend: Backend) -> None:
    """Add a backend at run time (the same as a plugin's ``registry.add``)."""
    DISPATCHER.register(backend)
    clear_caches()


def clear_caches() -> None:
    """Forget cached dispatch decisions (after changing backends or the tuning cache)."""
    _CALLS.clear()
    ops._RESOLVED.clear()
    DISPATCHER.clear_decisions()


def backends(all: bool = False):
    """Names of installed backends that can run on this machine (``all=True``: every installed one)."""
    return [b.name for b in DISPATCHER.backends() if all or not DISPATCHER.unavailable_reasons(b)]


def merge_attentions(outputs: Sequence[torch.Tensor], lses: Sequence[torch.Tensor]):
    """Combine attention results over disjoint key sets into the result over their union.

    ``outputs[i]``: ``[..., H, D_v]``; ``lses[i]``: ``[..., H]`` (natural log). Returns
    ``(output, lse)``. Numerically stable (max-shifted), differentiable, and exact for rows where
    some parts saw no key (lse -inf): those parts get weight 0; a row no part saw gives output 0
    and lse -inf.
    """
    if len(outputs) != len(lses) or not outputs:
        raise ValueError(
            f"merge_attentions needs one lse per output and at least one of each; got {len(outputs)} outputs "
            f"and {len(lses)} lses"
        )
    for i, (o, l) in enumerate(zip(outputs, lses)):
        for name, t in (("outputs", o), ("lses", l)):
            if not isinstance(t, torch.Tensor) or not t.is_floating_point():
                raise TypeError(f"merge_attentions: {name}[{i}] must be a floating torch.Tensor, got "
                                f"{t.dtype if isinstance(t, torch.Tensor) else type(t).__name__}")
            if t.device != outputs[0].device:
                raise ValueError(f"merge_attentions: {name}[{i}] is on {t.device} but outputs[0] is on "
                                 f"{outputs[0].device}; every part must be on one device")
        if o.shape[:-1] != l.shape or o.shape != outputs[0].shape:
            raise ValueError(
                f"outputs[{i}] has shape {tuple(o.shape)} and lses[{i}] {tuple(l.shape)}; every output must "
                f"have shape {tuple(outputs[0].shape)} and its lse that shape without the last axis"
            )
    lse = torch.stack([l.float() if l.dtype != torch.float64 else l for l in lses])
    top = lse.amax(dim=0).detach()
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    weights = torch.exp(lse - top)
    total = weights.sum(dim=0)
    empty = total == 0
    merged_lse = torch.where(empty, torch.full_like(total, -math.inf), top + torch.log(torch.where(empty, torch.ones_like(total), total)))
    share = weights / torch.where(empty, torch.ones_like(total), total)
    out = sum(share[i].unsqueeze(-1) * outputs[i].to(share.dtype) for i in range(len(outputs)))
    # the outputs' promoted dtype, as torch's arithmetic gives: outputs[0]'s alone made the
    # result's dtype depend on the parts' order (float32 + float64 gave float32, float64 + float32
    # float64)
    return out.to(functools.reduce(torch.promote_types, (o.dtype for o in outputs))), merged_lse
