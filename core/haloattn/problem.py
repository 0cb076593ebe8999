"""Problem: the frozen, hashable description of one attention call, validated before any backend
runs. Every rule of SEMANTICS.md that can be checked up front is checked here, and each error names
the argument, the axis, the value and what is allowed."""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence, Tuple, Union

import torch
from torch.autograd import forward_ad
from torch.utils._python_dispatch import _disable_current_modes

from .geometry import Axis

_functorch = getattr(torch._C, "_functorch", None)  # torch.func's internals (a mod's probe may be transformed)

PATTERNS = ("neighborhood", "window")
FLOATING_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

PerAxis = Union[int, bool, Sequence[int], Sequence[bool]]


@dataclass(frozen=True)
class Problem:
    """Everything a backend needs to decide whether it can run a call, and to run it."""

    batch: int
    spatial: Tuple[int, ...]
    heads: int
    kv_heads: int
    head_dim: int
    value_dim: int
    dtype: torch.dtype
    device: torch.device
    pattern: str
    axes: Tuple[Axis, ...]
    scale: float
    softcap: Optional[float] = None
    has_rpb: bool = False
    kq_conv_shape: Optional[Tuple[int, int]] = None  # (c_q, c_k)
    extra_tokens: int = 0
    score_mod: Optional[Callable] = field(default=None, compare=True)
    mask_mod: Optional[Callable] = field(default=None, compare=True)
    return_lse: bool = False

    @property
    def rank(self) -> int:
        return len(self.spatial)

    @property
    def tokens(self) -> int:
        return math.prod(self.spatial)

    @property
    def window(self) -> Tuple[int, ...]:
        return tuple(a.window for a in self.axes)

    @property
    def stride(self) -> Tuple[int, ...]:
        return tuple(a.stride for a in self.axes)

    @property
    def dilation(self) -> Tuple[int, ...]:
        return tuple(a.dilation for a in self.axes)

    @property
    def causal(self) -> Tuple[bool, ...]:
        return tuple(a.causal for a in self.axes)

    @property
    def shift(self) -> Tuple[int, ...]:
        return tuple(a.shift for a in self.axes)

    @property
    def has_mods(self) -> bool:
        return self.score_mod is not None or self.mask_mod is not None

    def apply_score_mod(self, scores: torch.Tensor, b, h, q_idx, kv_idx) -> torch.Tensor:
        """score_mod on ``scores``, its result in the scores' dtype (the compute dtype), as
        FlexAttention's kernels keep it: a score_mod reading a captured float64 table (numpy's
        default dtype) on float32 scores, or casting to 16 bits, otherwise failed inside a
        backend's matrix products with a dtype mismatch."""
        return self.score_mod(scores, b, h, q_idx, kv_idx).to(scores.dtype)

    def apply_mask_mod(self, b, h, q_idx, kv_idx) -> torch.Tensor:
        """mask_mod's verdict as a 4-D bool tensor that broadcasts like its index tensors (the
        probe at validation admits a bool tensor or a Python bool)."""
        allowed = self.mask_mod(b, h, q_idx, kv_idx)
        if not torch.is_tensor(allowed):
            allowed = torch.tensor(bool(allowed), device=q_idx.device)
        while allowed.dim() < 4:
            allowed = allowed.unsqueeze(0)
        return allowed

    @property
    def window_tokens(self) -> int:
        """Keys each query sees at most (window volume)."""
        return math.prod(self.window)

    def describe(self) -> str:
        shape = "x".join(map(str, self.spatial))
        win = "x".join(map(str, self.window))
        parts = [
            f"{self.pattern} rank {self.rank} grid {shape} window {win}",
            f"B={self.batch} H={self.heads}/{self.kv_heads} D={self.head_dim}/{self.value_dim}",
            str(self.dtype).replace("torch.", ""),
            str(self.device),
        ]
        if any(s > 1 for s in self.stride):
            parts.append("stride " + "x".join(map(str, self.stride)))
        if any(d > 1 for d in self.dilation):
            parts.append("dilation " + "x".join(map(str, self.dilation)))
        if any(self.causal):
            parts.append("causal " + "x".join("T" if c else "F" for c in self.causal))
        if any(self.shift):
            parts.append("shift " + "x".join(map(str, self.shift)))
        for flag, name in (
            (self.has_rpb, "rpb"),
            (self.softcap is not None, "softcap"),
            (self.kq_conv_shape is not None, "kq_conv"),
            (self.extra_tokens > 0, f"+{self.extra_tokens} tokens"),
            (self.score_mod is not None, "score_mod"),
            (self.mask_mod is not None, "mask_mod"),
        ):
            if flag:
                parts.append(name)
        return ", ".join(parts)


def _per_axis(name: str, value: PerAxis, rank: int, kind: type) -> tuple:
    """Broadcast an int/bool (or check a sequence) to one value per spatial axis."""
    if isinstance(value, (list, tuple)):
        if len(value) != rank:
            raise ValueError(
                f"{name}={tuple(value)!r} has {len(value)} entries but the token grid has rank {rank}; "
                f"give one value per spatial axis or a single {kind.__name__}"
            )
        items = tuple(value)
    else:
        items = (value,) * rank
    out = []
    for axis, item in enumerate(items):
        if kind is bool:
            if not isinstance(item, bool):
                raise TypeError(f"{name} on axis {axis} is {item!r}; expected a bool")
        else:
            if isinstance(item, bool) or not isinstance(item, int):
                raise TypeError(f"{name} on axis {axis} is {item!r} ({type(item).__name__}); expected an int")
        out.append(item)
    return tuple(out)


def cache_key(value):
    """``value`` as part of a key of the caches that let repeated calls skip validation (the call
    cache in api.py, the custom op's specs in ops.py). Python calls 3 and 3.0, 1 and True, and
    numpy's int64(3) and 3 equal, with one hash, though validation accepts only one of each
    pair: keyed by value alone, a cached valid call let the other through unvalidated (window=3.0
    ran as 3), and a refused call's spec, kept first, made the valid one fail. So every value but a
    plain int or None carries its type; a list or tuple becomes a tuple of such keys."""
    kind = type(value)
    if kind is int or value is None:
        return value
    if kind is tuple or kind is list:
        return tuple(x if type(x) is int else (type(x), x) for x in value)
    return kind, value


def check_window(window, rank: int) -> Tuple[int, ...]:
    """``window`` as one int >= 1 per spatial axis (the checks that need no grid length), raising
    as build_problem does; nn's blocks run it when they are built, before sizing their rpb
    tables from it."""
    windows = _per_axis("window", window, rank, int)
    for axis, K in enumerate(windows):
        if K < 1:
            raise ValueError(f"window on axis {axis} is {K}; it must be >= 1")
    return windows


def _finite(x) -> bool:
    """math.isfinite for an int or float, False for an int too large for a float (where
    math.isfinite raises OverflowError)."""
    try:
        return math.isfinite(x)
    except OverflowError:
        return False


def _check_tensor(name: str, t, *, min_dim: int = 1):
    if not torch.is_tensor(t):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in FLOATING_DTYPES:
        raise TypeError(
            f"{name} has dtype {t.dtype}; allowed: float16, bfloat16, float32, float64"
        )


def build_problem(
    query,
    key,
    value,
    window,
    *,
    stride=1,
    dilation=1,
    causal=False,
    pattern="neighborhood",
    shift=0,
    scale=None,
    softcap=None,
    rpb=None,
    score_mod=None,
    mask_mod=None,
    kq_conv=None,
    additional_keys=None,
    additional_values=None,
    return_lse=False,
) -> Problem:
    """Validate the arguments of ``haloattn.attention`` and describe them as a Problem."""
    for name, t in (("query", query), ("key", key), ("value", value)):
        _check_tensor(name, t)
    if query.dim() not in (4, 5, 6):
        raise ValueError(
            f"query has {query.dim()} dimensions (shape {tuple(query.shape)}); expected "
            "[B, *spatial, H, D] with 1, 2 or 3 spatial axes (4, 5 or 6 dimensions)"
        )
    for name, t in (("key", key), ("value", value)):
        if t.dim() != query.dim():
            raise ValueError(
                f"{name} has {t.dim()} dimensions (shape {tuple(t.shape)}) but query has {query.dim()}; "
                f"all three are [B, *spatial, heads, dim]"
            )
    rank = query.dim() - 3
    batch, spatial = query.shape[0], tuple(query.shape[1:-2])
    heads, head_dim = query.shape[-2], query.shape[-1]
    kv_heads = key.shape[-2]
    for axis, extent in enumerate(spatial):
        if extent < 1:
            raise ValueError(f"query spatial axis {axis} is empty (length {extent}); every axis needs >= 1 token")
    for what, extent in (("batch", batch), ("heads", heads), ("head_dim", head_dim)):
        if extent < 1:
            raise ValueError(
                f"query shape {tuple(query.shape)} has an empty {what} axis (length 0); it needs >= 1"
            )
    for name, t in (("key", key), ("value", value)):
        if t.shape[0] != batch:
            raise ValueError(f"{name} batch {t.shape[0]} does not match query batch {batch}")
        for axis in range(rank):
            if t.shape[1 + axis] != spatial[axis]:
                raise ValueError(
                    f"{name} spatial axis {axis} has length {t.shape[1 + axis]} but query's has {spatial[axis]}; "
                    "query, key and value share one token grid"
                )
    if value.shape[-2] != kv_heads:
        raise ValueError(f"value has {value.shape[-2]} heads but key has {kv_heads}; they must match")
    if kv_heads < 1 or heads % kv_heads != 0:
        raise ValueError(
            f"query heads {heads} is not divisible by key/value heads {kv_heads}; "
            "GQA/MQA needs H % H_kv == 0"
        )
    if key.shape[-1] != head_dim:
        raise ValueError(f"key head_dim {key.shape[-1]} does not match query head_dim {head_dim}")
    value_dim = value.shape[-1]
    if value_dim < 1:
        raise ValueError("value has an empty head dimension")
    if key.dtype != query.dtype or value.dtype != query.dtype:
        raise TypeError(
            f"query, key and value must share one dtype; got {query.dtype}, {key.dtype}, {value.dtype}"
        )
    if key.device != query.device or value.device != query.device:
        raise ValueError(
            f"query, key and value must be on one device; got {query.device}, {key.device}, {value.device}"
        )

    if not isinstance(pattern, str) or pattern not in PATTERNS:
        raise ValueError(f"pattern={pattern!r} is unknown; allowed: {', '.join(map(repr, PATTERNS))}")
    windows = check_window(window, rank)
    strides = _per_axis("stride", stride, rank, int)
    dilations = _per_axis("dilation", dilation, rank, int)
    causals = _per_axis("causal", causal, rank, bool)
    shifts = _per_axis("shift", shift, rank, int)
    axes = []
    for a in range(rank):
        L, K, S, Dl, s = spatial[a], windows[a], strides[a], dilations[a], shifts[a]
        if Dl < 1:
            raise ValueError(f"dilation on axis {a} is {Dl}; it must be >= 1")
        if K * Dl > L:
            raise ValueError(
                f"window {K} x dilation {Dl} = {K * Dl} on axis {a} exceeds the axis length {L}; "
                f"allowed: window * dilation <= {L}"
            )
        if not 1 <= S <= K:
            raise ValueError(f"stride on axis {a} is {S}; allowed: 1 <= stride <= window ({K})")
        if pattern == "window":
            if S != 1:
                raise ValueError(
                    f"stride on axis {a} is {S} but pattern 'window' has no stride; use stride=1 "
                    "(stride groups queries of pattern 'neighborhood')"
                )
            if not 0 <= s < K:
                raise ValueError(f"shift on axis {a} is {s}; allowed: 0 <= shift < window ({K})")
        elif s != 0:
            raise ValueError(
                f"shift on axis {a} is {s} but pattern is 'neighborhood'; shift applies to pattern 'window' only"
            )
        axes.append(Axis(L, K, S, Dl, causals[a], s))

    if scale is None:
        scale = head_dim ** -0.5
    elif isinstance(scale, bool) or not isinstance(scale, (int, float)) or not _finite(scale):
        raise TypeError(f"scale={scale!r}; expected a finite float (or None for head_dim ** -0.5)")
    if softcap is not None:
        if isinstance(softcap, bool) or not isinstance(softcap, (int, float)) or not softcap > 0 or not _finite(softcap):
            raise ValueError(f"softcap={softcap!r}; expected a finite float > 0, or None")
        softcap = float(softcap)

    if rpb is not None:
        _check_tensor("rpb", rpb)
        expected = (heads,) + tuple(2 * k - 1 for k in windows)
        if tuple(rpb.shape) != expected:
            raise ValueError(
                f"rpb has shape {tuple(rpb.shape)}; expected [H, 2K-1 per axis] = {expected}"
            )
        _same_place("rpb", rpb, query, parameter=True)

    kq_conv_shape = None
    if kq_conv is not None:
        _check_tensor("kq_conv", kq_conv)
        if rank != 1:
            raise ValueError(f"kq_conv needs a rank-1 token grid; this grid has rank {rank} ({spatial})")
        if kq_conv.dim() != 3:
            raise ValueError(f"kq_conv has shape {tuple(kq_conv.shape)}; expected [H, c_q, c_k]")
        h, c_q, c_k = kq_conv.shape
        if h != heads:
            raise ValueError(f"kq_conv has {h} heads; expected one kernel per query head ({heads})")
        if c_q < 1 or c_k < 1 or c_k % 2 == 0:
            raise ValueError(f"kq_conv kernel is c_q={c_q} x c_k={c_k}; c_q >= 1 and c_k must be odd")
        _same_place("kq_conv", kq_conv, query, parameter=True)
        kq_conv_shape = (c_q, c_k)

    extra = 0
    if (additional_keys is None) != (additional_values is None):
        given = "additional_keys" if additional_values is None else "additional_values"
        missing = "additional_values" if additional_values is None else "additional_keys"
        raise ValueError(f"{given} was given without {missing}; pass both or neither")
    if additional_keys is not None:
        for name, t, dim in (
            ("additional_keys", additional_keys, head_dim),
            ("additional_values", additional_values, value_dim),
        ):
            _check_tensor(name, t)
            if t.dim() != 4 or t.shape[0] != batch or t.shape[2] != kv_heads or t.shape[3] != dim:
                raise ValueError(
                    f"{name} has shape {tuple(t.shape)}; expected [B, E, H_kv, {'D' if dim == head_dim else 'D_v'}] "
                    f"= [{batch}, E, {kv_heads}, {dim}]"
                )
            _same_place(name, t, query)
        if additional_keys.shape[1] != additional_values.shape[1]:
            raise ValueError(
                f"additional_keys has {additional_keys.shape[1]} tokens but additional_values has "
                f"{additional_values.shape[1]}"
            )
        extra = additional_keys.shape[1]
        if extra < 1:
            raise ValueError("additional_keys has no tokens (E = 0); pass None instead")

    check_mods(score_mod, mask_mod)
    _check_score_mod(score_mod, heads, query.device)
    _check_mask_mod(mask_mod, heads, query.device)
    if not isinstance(return_lse, bool):
        raise TypeError(f"return_lse must be a bool, got {return_lse!r}")

    return Problem(
        batch=batch,
        spatial=spatial,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        value_dim=value_dim,
        dtype=query.dtype,
        device=query.device,
        pattern=pattern,
        axes=tuple(axes),
        scale=float(scale),
        softcap=softcap,
        has_rpb=rpb is not None,
        kq_conv_shape=kq_conv_shape,
        extra_tokens=extra,
        score_mod=score_mod,
        mask_mod=mask_mod,
        return_lse=return_lse,
    )


def check_mods(score_mod, mask_mod) -> None:
    """score_mod and mask_mod are callables (or None) that can be hashed: calls are cached and
    dispatched by a key holding them (an unhashable one, such as an instance of a @dataclass with
    __call__, whose generated __eq__ removes __hash__, failed inside the dispatcher)."""
    for name, fn in (("score_mod", score_mod), ("mask_mod", mask_mod)):
        if fn is None:
            continue
        if not callable(fn):
            raise TypeError(f"{name} must be callable, got {type(fn).__name__}")
        _check_arity(name, fn)
        try:
            hash(fn)
        except TypeError as err:
            raise TypeError(
                f"{name} is a {type(fn).__name__} instance, which is not hashable ({err}); haloattn keys its "
                "caches on the function: pass a plain function or functools.partial, or make the callable "
                "hashable (a @dataclass with __call__ needs eq=False or frozen=True: its generated __eq__ "
                "removes __hash__)"
            ) from None


def mods_on_indices(score_mod, mask_mod, index: Callable):
    """``score_mod`` and ``mask_mod`` (either may be None) called with ``index(b, h)`` in place of
    the batch and head indices they are given: the mods of a call whose ``b`` or ``h`` number
    something else than the user's call does (a vmap's folded batch, a DTensor shard's heads)."""
    score = mask = None
    if score_mod is not None:
        def score(s, b, h, q_idx, kv_idx):
            return score_mod(s, *index(b, h), q_idx, kv_idx)
    if mask_mod is not None:
        def mask(b, h, q_idx, kv_idx):
            return mask_mod(*index(b, h), q_idx, kv_idx)
    return score, mask


_MOD_ARGUMENTS = {
    "score_mod": ("score", "b", "h", "q_idx", "kv_idx"),
    "mask_mod": ("b", "h", "q_idx", "kv_idx"),
}


def _check_arity(name: str, fn) -> None:
    """``fn`` accepts the positional arguments haloattn calls it with (FlexAttention's
    signatures): a mask_mod written as a score_mod or the other way round otherwise failed
    inside a backend with a TypeError naming neither. Callables whose signature Python cannot
    read (some builtins) are left to the call itself."""
    arguments = _MOD_ARGUMENTS[name]
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(*arguments)
    except TypeError as err:
        raise TypeError(
            f"{name} {getattr(fn, '__name__', type(fn).__name__)}{signature} cannot be called as "
            f"{name}({', '.join(arguments)}) ({err}); haloattn calls it with these {len(arguments)} positional "
            "arguments, as FlexAttention does"
        ) from None


def _check_score_mod(score_mod, heads: int, device) -> None:
    """One probe call on a single score per head: the result must be floating scores of the
    probe's shape (the function acts elementwise, as FlexAttention applies it to one score at a
    time: a result reduced over the scores, or a captured [H] tensor added without indexing it by
    ``h``, changes the shape here, and would silently mean something else on a block), and must
    not depend on a tensor that requires grad: backends treat captured tensors as constants, so
    such a tensor would silently get no gradient. (mask_mod returns booleans: no gradient can
    flow through it.)"""
    if score_mod is None:
        return
    _check_probe(_probe_call(_probe, score_mod, heads, device), heads)


def _check_mask_mod(mask_mod, heads: int, device) -> None:
    """One probe call, as for score_mod: the result must be booleans (a tensor of dtype bool, or
    a Python bool) that broadcast against one pair per head. mask_mod's verdict was taken with
    ``.bool()`` before, so a float mask written the additive way (0 keep, -inf drop) kept exactly
    the pairs it meant to drop, and a function returning None masked every pair: silently. A
    captured [N, N] table returned whole instead of indexed by q_idx and kv_idx failed deep
    inside a backend's broadcasting."""
    if mask_mod is None:
        return
    probe = _probe_call(_probe_mask, mask_mod, heads, device)
    if isinstance(probe, bool):
        return
    _check_not_vmapped(probe, "mask_mod")
    if not torch.is_tensor(probe) or probe.dtype != torch.bool:
        got = f"dtype {probe.dtype}" if torch.is_tensor(probe) else f"a {type(probe).__name__}"
        raise TypeError(
            f"mask_mod returned {got}; it must return booleans (a bool tensor, True where the pair is kept), "
            "as FlexAttention's mask_mod does: an additive float mask (0 / -inf) belongs in score_mod"
        )
    shape = (1, 1, heads, 1)
    try:
        fits = torch.broadcast_shapes(probe.shape, shape) == shape
    except RuntimeError:
        fits = False
    if not fits:
        raise ValueError(
            f"mask_mod returned shape {tuple(probe.shape)} for one pair per head (b, q_idx, kv_idx of shape "
            f"(1, 1, 1, 1), h of shape {shape}); it must act elementwise on its index tensors, as FlexAttention "
            "applies it to one pair at a time: captured tables indexed by them (e.g. allowed[q_idx, kv_idx]), "
            "not returned whole"
        )


def _probe_call(probe, mod, heads: int, device):
    """``probe(mod, heads, device)`` on real tensors, outside any dispatch mode: under a
    FakeTensorMode (torch.compile's tracing, the custom op's fake) fake probe indices into a
    captured real table raised inside torch, so a mod reading a captured tensor did not compile
    (nor run under FakeTensorMode). Meta inputs (shape inference) beside captured tables that hold
    data are probed on the CPU, where meta indices cannot meet a CPU table (the first error if
    that fails too)."""
    with _disable_current_modes():
        try:
            return probe(mod, heads, device)
        except RuntimeError as first:
            if torch.device(device).type != "meta":
                raise
            try:
                return probe(mod, heads, "cpu")
            except RuntimeError:
                raise first from None


def _probe_mask(mask_mod, heads: int, device):
    """mask_mod on a single pair per head at index 0, on ``device``."""
    index = torch.zeros(1, 1, 1, 1, dtype=torch.long, device=device)
    heads_index = torch.arange(heads, device=device).view(1, 1, heads, 1)
    return mask_mod(index, heads_index, index, index)


def _probe(score_mod, heads: int, device):
    """score_mod on a single score per head at index 0, on ``device``."""
    index = torch.zeros(1, 1, 1, 1, dtype=torch.long, device=device)
    heads_index = torch.arange(heads, device=device).view(1, 1, heads, 1)
    scores = torch.zeros(1, 1, heads, 1, device=device)
    return score_mod(scores, index, heads_index, index, index)


def _check_probe(probe, heads: int) -> None:
    """The probe's result: floating scores of the probe's shape, not depending on a tensor that
    requires grad (see _check_score_mod)."""
    shape = (1, 1, heads, 1)
    if not torch.is_tensor(probe) or not probe.is_floating_point():
        got = f"dtype {probe.dtype}" if torch.is_tensor(probe) else f"a {type(probe).__name__}"
        raise TypeError(f"score_mod returned {got}; it must return the modified scores, a floating tensor "
                        "shaped like its first argument")
    if probe.shape != shape:
        raise ValueError(
            f"score_mod returned shape {tuple(probe.shape)} for scores of shape {shape} (one score "
            "per head); it must act elementwise, as FlexAttention applies it to one score at a time: no reductions "
            "over the scores, and captured per-head tensors indexed by h (e.g. bias[h]), not added whole")
    if torch.is_grad_enabled() and probe.requires_grad:
        raise ValueError(
            "score_mod reads a tensor that requires grad; haloattn treats captured tensors as constants "
            "and would give it no gradient. Pass a learned relative bias as rpb= (it gets a gradient), "
            "or capture a detached tensor if no gradient is wanted"
        )
    # Forward-mode AD ignores grad mode: a captured dual tensor's tangent was dropped whatever the
    # mode (torch.func.jvp of a call whose score_mod read a tensor with a tangent gave the tangent
    # of the other inputs alone, without a word).
    if forward_ad.unpack_dual(probe).tangent is not None:
        raise ValueError(
            "score_mod reads a tensor that carries a forward-mode tangent (torch.func.jvp, jacfwd, "
            "torch.autograd.forward_ad); haloattn treats captured tensors as constants and would drop its "
            "tangent. Pass a learned relative bias as rpb= (its tangent is followed), or capture the primal "
            "alone (torch.autograd.forward_ad.unpack_dual(t).primal) if no tangent is wanted"
        )
    _check_not_vmapped(probe, "score_mod")


def _check_not_vmapped(probe, name: str) -> None:
    """A mod's probe result must not be batched by torch.func.vmap at any level (a captured
    tensor that is vmapped over, such as per-sample lengths): backends treat captured tensors as
    constants, and the reference's in-place writes then failed deep inside torch with vmap errors
    that asked for a torch bug report."""
    is_wrapped = getattr(_functorch, "is_functorch_wrapped_tensor", None)
    if is_wrapped is None or not torch.is_tensor(probe):
        return
    while is_wrapped(probe):
        if _functorch.is_batchedtensor(probe):
            raise ValueError(
                f"{name} reads a tensor that torch.func.vmap batches; haloattn treats captured tensors as "
                "constants and cannot batch over them. Fold the vmapped dimension into the batch axis of "
                "query/key/value and index the captured tensor by b, run one call per vmapped index, or "
                "pass a learned relative bias as rpb= (which may be vmapped)"
            )
        probe = _functorch.get_unwrapped(probe)


def _same_place(name: str, t: torch.Tensor, query: torch.Tensor, parameter: bool = False):
    # Learned tables (rpb, kq_conv) usually stay float32 under autocast: allow that too.
    allowed = (query.dtype, torch.float32) if parameter else (query.dtype,)
    if t.dtype not in allowed:
        names = " or ".join(str(d) for d in dict.fromkeys(allowed))
        raise TypeError(f"{name} has dtype {t.dtype}; allowed: {names} (query is {query.dtype})")
    if t.device != query.device:
        raise ValueError(f"{name} is on {t.device} but query is on {query.device}")
