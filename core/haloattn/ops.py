"""Autograd and torch.library wrappers around a chosen backend.

Eager calls go through :class:`AttentionFunction` (cheapest path). Under ``torch.compile`` the call
becomes the custom ops ``haloattn::attention`` / ``haloattn::attention_backward``, with fake
implementations that validate the problem and give output shapes, so a model compiles with
``fullgraph=True``. Both paths call the same backend ``forward``/``backward``.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import sys
from typing import List, Optional, Sequence

import torch

from . import batching, second_order
from .backend import AttentionInputs, checked_gradients, checked_outputs, on_device
from .dispatch import DISPATCHER
from .problem import build_problem, cache_key


def lse_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _dense(grad):
    """A gradient with rows of its own: reductions such as ``out.sum()`` or ``lse.sum()`` hand the
    backward expanded tensors (zero strides, one stored element), which kernels reading rows by
    offset would read past. Any other layout is left to the backend."""
    return grad.contiguous() if grad is not None and 0 in grad.stride() else grad


def _output_gradients(grad_out, grad_lse, out):
    """What every backend's backward receives: dO (zeros where autograd passes None because only
    the lse was used) and dLSE (or None), neither of them expanded."""
    grad_out = _dense(grad_out) if grad_out is not None else torch.zeros_like(out)
    return grad_out, _dense(grad_lse)


def _full_grads(problem, backend, config, inputs, out, lse, grad_out, grad_lse, needs):
    grad_out, grad_lse = _output_gradients(grad_out, grad_lse, out)
    with on_device(out.device):
        return backend.backward(problem, inputs, out, lse, grad_out, grad_lse, needs, config)


_is_legacy_batched = getattr(getattr(torch._C, "_functorch", None), "is_legacy_batchedtensor", lambda t: False)


def _refuse_legacy_vmap(tensors, what: str) -> None:
    """Raise where a rule meets torch's legacy vmap (``torch.autograd.grad(..., is_grads_batched=True)``,
    ``torch.autograd.functional.jacobian(..., vectorize=True)``, gradcheck's batched checks): it
    runs no Function's vmap rule, and the backends' in-place accumulation into unbatched buffers
    failed deep inside with a vmap error that asked for a torch bug report."""
    if any(t is not None and _is_legacy_batched(t) for t in tensors):
        raise NotImplementedError(
            f"haloattn.attention: the {what} received batched {'gradients' if what == 'backward' else 'tangents'} "
            "from torch's legacy vmap (torch.autograd.grad(..., is_grads_batched=True), "
            "torch.autograd.functional.jacobian/hessian(..., vectorize=True), gradcheck's check_batched_grad / "
            "check_batched_forward_grad), which haloattn does not support. Use torch.func instead: "
            "torch.func.jacrev / jacfwd, or torch.func.vmap over torch.func.vjp / jvp (folded into the batch)"
        )


class AttentionFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, problem, backend, config, *tensors):
        inputs = AttentionInputs(*tensors)
        needs = ctx.needs_input_grad[3:]
        ctx.state = None
        with on_device(inputs.query.device):
            if backend.keeps_state and any(needs):
                result = backend.forward_with_state(problem, inputs, needs, config)
                if not (isinstance(result, tuple) and len(result) == 3):
                    raise RuntimeError(f"haloattn: backend {backend.name!r} returned {type(result).__name__} from "
                                       "forward_with_state; expected a tuple (out, lse, state) (docs/plugins.md)")
                out, lse, ctx.state = result
            else:
                result = backend.forward(problem, inputs, config)
                # the first result per signature is checked in full (api.attention); this one only
                # needs to unpack
                out, lse = result if isinstance(result, tuple) and len(result) == 2 else checked_outputs(
                    backend, inputs, result)
        ctx.problem, ctx.backend, ctx.config = problem, backend, config
        ctx.save_for_backward(*tensors, out, lse)
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, grad_out, grad_lse):
        _refuse_legacy_vmap((grad_out, grad_lse), "backward")
        *tensors, out, lse = ctx.saved_tensors
        needs = ctx.needs_input_grad[3:]

        def first_order():
            if ctx.state is not None:
                with on_device(out.device):
                    return ctx.backend.backward_from_state(ctx.state, *_output_gradients(grad_out, grad_lse, out))
            return _full_grads(
                ctx.problem, ctx.backend, ctx.config, AttentionInputs(*tensors), out, lse, grad_out, grad_lse, needs
            )

        if second_order.recorded(tensors, grad_out, grad_lse):  # create_graph=True
            with on_device(out.device):
                grads = second_order.gradients(ctx.backend, ctx.problem, AttentionInputs(*tensors),
                                               *_output_gradients(grad_out, grad_lse, out), needs, first_order)
        else:
            with torch.no_grad():
                grads = first_order()
        return (None, None, None, *checked_gradients(ctx.backend, AttentionInputs(*tensors), grads, needs))


def _outside_transforms():
    """The rule runs as if no torch.func transform were active: the tensors it creates (outputs,
    scratch) are plain ones, not a transform's wrappers, and torch.autograd may run (the
    reference's rule differentiates its block computation)."""
    try:
        from torch._functorch.pyfunctorch import temporarily_clear_interpreter_stack
    except ImportError:  # a torch without functorch's Python interpreter stack
        return contextlib.nullcontext()
    return temporarily_clear_interpreter_stack()


class TransformableAttentionFunction(torch.autograd.Function):
    """The call under forward-mode AD (``torch.func.jvp``, ``torch.autograd.forward_ad``) or a
    torch.func transform (``grad``, ``vjp``, ``vmap``): the form torch.func needs (context set up
    apart from the forward), with the backend's JVP rule and a vmap rule. Plain autograd calls keep
    :class:`AttentionFunction`, which may keep backend state between forward and backward.

    The backward and the JVP run through Functions of their own (:class:`_AttentionBackward`,
    :class:`_AttentionJvp`), which give them vmap rules too and are first order: a backward
    through a tangent, or a second derivative of either rule, raises and says so."""

    @staticmethod
    def forward(problem, backend, config, *tensors):
        with on_device(tensors[0].device):
            return backend.forward(problem, AttentionInputs(*tensors), config)

    @staticmethod
    def setup_context(ctx, inputs, output):
        problem, backend, config, *tensors = inputs
        out, lse = output
        ctx.problem, ctx.backend, ctx.config = problem, backend, config
        ctx.present = [t is not None for t in tensors]
        saved = [t for t in tensors if t is not None] + [out, lse]
        ctx.save_for_backward(*saved)
        ctx.save_for_forward(*saved)
        ctx.set_materialize_grads(False)

    @staticmethod
    def vmap(info, in_dims, problem, backend, config, *tensors):
        """torch.func.vmap of the call: the vmapped dimension folded into the batch (batching.py);
        a backward or JVP inside the vmap (vmap over grad, jacrev, jacfwd) goes through the
        vmap rules of _AttentionBackward and _AttentionJvp."""
        return batching.vmapped(
            info.batch_size, lambda p, *ts: TransformableAttentionFunction.apply(p, backend, config, *ts), problem,
            tensors, in_dims[3:])

    @staticmethod
    def _saved(ctx):
        """(O and LSE, the seven inputs with None where absent) as the forward saved them;
        torch.func hands them over at each transform's level."""
        saved = list(ctx.saved_tensors)
        it = iter(saved[:-2])
        return saved[-2:], [next(it) if p else None for p in ctx.present]

    @staticmethod
    def backward(ctx, grad_out, grad_lse):
        # Through a Function of its own, so that the backward has a vmap rule too (vmap over grad:
        # per-sample gradients).
        _refuse_legacy_vmap((grad_out, grad_lse), "backward")
        out_lse, inputs = TransformableAttentionFunction._saved(ctx)
        grads = _AttentionBackward.apply(ctx.problem, ctx.backend, ctx.config, tuple(ctx.needs_input_grad[3:]),
                                         grad_out, grad_lse, *out_lse, *inputs)
        return (None, None, None, *grads)

    @staticmethod
    def jvp(ctx, _problem, _backend, _config, *tangents):
        # Through a Function of its own, so that the rule has a vmap rule too (jacfwd).
        _refuse_legacy_vmap(tangents, "JVP")
        out_lse, inputs = TransformableAttentionFunction._saved(ctx)
        tangents = [t if p else None for t, p in zip(tangents, ctx.present)]
        # A backward that reaches these tangents meets _AttentionJvp's, which raises.
        return _AttentionJvp.apply(ctx.problem, ctx.backend, ctx.config, *out_lse, *inputs, *tangents)


class _FirstOrderRule(torch.autograd.Function):
    """A rule (the backward, the JVP) run as a Function for its vmap rule: it keeps nothing, and
    a tangent of it is a second derivative, which raises. Subclasses say in ``backward`` why a
    backward through them raises."""

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def jvp(ctx, *tangents):
        raise NotImplementedError(_SECOND_ORDER)


class _AttentionBackward(_FirstOrderRule):
    """The gradients of TransformableAttentionFunction's call, as a function of (dO, dLSE, O, LSE
    and the inputs): the backend's backward, with a vmap rule (the vmapped dimension folded into
    the batch, as for the call). Not differentiable again."""

    @staticmethod
    def forward(problem, backend, config, needs, grad_out, grad_lse, out, lse, *tensors):
        with _outside_transforms():
            return tuple(_full_grads(problem, backend, config, AttentionInputs(*tensors), out, lse, grad_out, grad_lse,
                                     needs))

    @staticmethod
    def backward(ctx, *grads):
        raise NotImplementedError(_SECOND_ORDER)

    @staticmethod
    def vmap(info, in_dims, problem, backend, config, needs, *tensors):
        """vmap over the gradients (per-sample gradients, jacrev): folded into the batch where no
        per-head table is vmapped or needs a gradient (its gradient would be summed over the
        vmapped dimension), index by index otherwise."""
        # tensors: dO, dLSE, O, LSE, then the inputs (their per-head tables at 4 + SHARED)
        shared = tuple(4 + i for i in batching.SHARED)
        return batching.vmapped(
            info.batch_size, lambda p, *ts: _AttentionBackward.apply(p, backend, config, needs, *ts), problem,
            tensors, in_dims[4:], shared, may_fold=not any(needs[i] for i in batching.SHARED))


class _AttentionJvp(_FirstOrderRule):
    """The tangents of TransformableAttentionFunction's call, as a function of (O, LSE, the inputs
    and their tangents): the backend's JVP rule, with a vmap rule (folded into the batch, as for
    the call)."""

    @staticmethod
    def forward(problem, backend, config, out, lse, *tensors):
        inputs, tangents = AttentionInputs(*tensors[:7]), AttentionInputs(*tensors[7:])
        with on_device(out.device), torch.no_grad(), _outside_transforms():
            return backend.jvp(problem, inputs, tangents, out, lse, config)

    @staticmethod
    def backward(ctx, *grads):
        raise NotImplementedError(_NOT_DIFFERENTIABLE_TANGENT)

    @staticmethod
    def vmap(info, in_dims, problem, backend, config, out, lse, *tensors):
        """vmap over the tangents (jacfwd): folded into the batch unless a per-head table or its
        tangent is vmapped."""
        # tensors after O and LSE: the 7 inputs, then their 7 tangents
        shared = tuple(2 + i for i in batching.SHARED) + tuple(9 + i for i in batching.SHARED)
        return batching.vmapped(
            info.batch_size, lambda p, *ts: _AttentionJvp.apply(p, backend, config, *ts), problem,
            [out, lse, *tensors], in_dims[3:], shared)


_SECOND_ORDER = (
    "haloattn.attention's derivatives are first order under torch.func transforms and forward-mode AD: "
    "its backward and JVP rules there are not differentiable again (a gradient of a gradient, a tangent of "
    "a tangent, a Hessian). Second derivatives run in plain torch.autograd (create_graph=True) with "
    "backend='reference'"
)
_NOT_DIFFERENTIABLE_TANGENT = (
    "haloattn.attention: a backward pass reached the tangent of a JVP (torch.func.jvp / forward_ad). "
    "haloattn's JVP rules are first order: their tangents are not differentiable. Detach the tangent (as "
    "MeanFlow and consistency-model losses do with their targets), or differentiate the primal output only"
)


# ---------------------------------------------------------------------------------------------
# torch.compile path. Non-tensor arguments travel as a spec string because custom ops take only
# tensors and simple values. Without a score_mod or mask_mod the spec is the options themselves
# (JSON), so a graph that names it (torch.export.save, then load in another process) still
# runs; a call with mods gets a key into _SPECS, which keeps the functions by reference in this
# process only.
_SPECS: dict = {}
_RESOLVED: dict = {}
# Numbers of the keys of specs with mods: next() of a count is one step under the GIL, where
# f"spec{len(_SPECS)}" let two threads registering at once both take spec{n}, and the later
# one's options replace the earlier's (that call then ran with another call's mods).
_SPEC_NUMBERS = itertools.count()


def assume_constant_result(fn):
    """torch.compiler.assume_constant_result without its import of torch._dynamo (1.5 s, most of
    ``import haloattn``). The decorator only sets this mark, which dynamo reads when it traces;
    tests/test_compile.py fails (graph break on spec_key) if a torch release changes that."""
    if "torch._dynamo" in sys.modules:
        return torch.compiler.assume_constant_result(fn)
    fn._dynamo_marked_constant = True
    return fn


@assume_constant_result
def spec_key(options: tuple) -> str:
    """The spec of call options (names, values): their JSON, or a registered key with mods.
    Looked up by typed values (problem.cache_key): window=3.0 and window=3 compare equal, and the
    spec of a refused call, kept first, would otherwise be handed to the valid one."""
    lookup = ("key", options[0], tuple(cache_key(v) for v in options[1]))
    try:
        key = _SPECS.get(lookup)
    except TypeError:
        # an unhashable argument (window=[[3]], backend={...}, a score_mod object without a hash),
        # which no valid call has: a spec of its own, whose validation in the fake names it
        key = lookup = None
    if key is None:
        key = _described(options) or f"spec{next(_SPEC_NUMBERS)}"
        if lookup is not None:
            _SPECS[lookup] = key
        _SPECS[key] = options
    return key


def _described(options: tuple) -> Optional[str]:
    """The options as JSON (tuples as lists), or None where a score_mod or mask_mod (a Python
    function, which JSON cannot carry) is among them."""
    named = dict(zip(*options))
    if named.get("score_mod") is not None or named.get("mask_mod") is not None:
        return None
    try:
        described = json.dumps(named, separators=(",", ":"))
    except (TypeError, ValueError):  # a value of another type (numpy integers, say) keeps a key
        return None
    return described if _parsed(described) == options else None


def _parsed(described: str) -> tuple:
    """Options (names, values) from their JSON: lists back to tuples."""
    named = json.loads(described)
    return tuple(named), tuple(tuple(v) if isinstance(v, list) else v for v in named.values())


def _options(spec: str) -> dict:
    options = _SPECS.get(spec)
    if options is None and spec.startswith("{"):
        # A described spec this process has not made (a graph loaded from a file): JSON gives
        # lists where the call had tuples.
        options = _SPECS[spec] = _parsed(spec)
    if options is None:
        raise KeyError(f"haloattn: spec {spec!r} names call options of another process (a call with a score_mod or "
                       "mask_mod, whose functions only the process that traced it holds)")
    names, values = options
    return dict(zip(names, values))


def _resolve(spec: str, inputs: AttentionInputs):
    signature = (spec,) + tuple(
        None if t is None else (t.shape, t.dtype, t.device) for t in inputs
    )
    resolved = _RESOLVED.get(signature)
    if resolved is None:
        problem = problem_of_spec(spec, *inputs)
        backend, config = DISPATCHER.select(problem, _options(spec)["backend"])
        resolved = _RESOLVED[signature] = (problem, backend, config)
    return resolved


def _problem(inputs: AttentionInputs, options: dict):
    q, k, v, rpb, kq, ak, av = inputs
    return build_problem(q, k, v, rpb=rpb, kq_conv=kq, additional_keys=ak, additional_values=av, **options)


@torch.library.custom_op("haloattn::attention", mutates_args=())
def attention_op(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    rpb: Optional[torch.Tensor],
    kq_conv: Optional[torch.Tensor],
    additional_keys: Optional[torch.Tensor],
    additional_values: Optional[torch.Tensor],
    spec: str,
) -> tuple[torch.Tensor, torch.Tensor]:  # builtin tuple: torch 2.5 reads the annotation without typing's names
    inputs = AttentionInputs(query, key, value, rpb, kq_conv, additional_keys, additional_values)
    problem, backend, config = _resolve(spec, inputs)
    with on_device(query.device):
        out, lse = checked_outputs(backend, inputs, backend.forward(problem, inputs, config))
    # The fake promises contiguous outputs; a backend may return other layouts.
    return out.contiguous(), lse.contiguous()


def problem_of_spec(spec: str, *tensors: Optional[torch.Tensor]):
    """The validated problem of a custom-op call: its tensors (any device, meta and fake ones
    too) and its spec's options."""
    options = _options(spec)
    backend = options.pop("backend")
    problem = _problem(AttentionInputs(*tensors), options)
    # the forced backend is checked as an eager call checks it (the fake dispatches nothing, and
    # meta-tensor calls ignored an unknown or ill-typed name)
    DISPATCHER.check_forced(backend)
    return problem


@attention_op.register_fake
def _attention_fake(query, key, value, rpb, kq_conv, additional_keys, additional_values, spec):
    problem_of_spec(spec, query, key, value, rpb, kq_conv, additional_keys, additional_values)
    out = query.new_empty(*query.shape[:-1], value.shape[-1])
    lse = query.new_empty(query.shape[:-1], dtype=lse_dtype(query.dtype))
    return out, lse


@torch.library.custom_op("haloattn::attention_backward", mutates_args=())
def attention_backward_op(
    grad_out: torch.Tensor,
    grad_lse: Optional[torch.Tensor],
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    rpb: Optional[torch.Tensor],
    kq_conv: Optional[torch.Tensor],
    additional_keys: Optional[torch.Tensor],
    additional_values: Optional[torch.Tensor],
    out: torch.Tensor,
    lse: torch.Tensor,
    spec: str,
    needs: List[bool],
) -> List[torch.Tensor]:
    inputs = AttentionInputs(query, key, value, rpb, kq_conv, additional_keys, additional_values)
    problem, backend, config = _resolve(spec, inputs)
    grads = checked_gradients(backend, inputs, _full_grads(problem, backend, config, inputs, out, lse, grad_out,
                                                           grad_lse, needs), needs)
    return [_laid_out_like_fake(g, t) for g, t, n in zip(grads, inputs, needs) if n]


def _laid_out_like_fake(grad: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``grad`` with the strides and dtype the fake promised (``empty_like(input)``). Backends return
    some gradients in their own layout (the window backend's rpb gradient is contiguous while a
    compiled graph may hand it a transposed table); inductor checks the strides it was promised,
    and not the dtype (a plugin's gradient in another dtype went on through the compiled graph)."""
    if grad.dtype != like.dtype:
        return torch.empty_like(like).copy_(grad)
    if like.is_contiguous() and grad.stride() == like.stride():
        return grad  # the common case, without building the fake's layout (a few us per gradient)
    want = torch.empty_like(like, device="meta").stride()
    if grad.stride() == want:
        return grad
    laid_out = torch.empty_like(like)
    laid_out.copy_(grad)
    return laid_out


@attention_backward_op.register_fake
def _attention_backward_fake(grad_out, grad_lse, query, key, value, rpb, kq_conv, ak, av, out, lse, spec, needs):
    inputs = (query, key, value, rpb, kq_conv, ak, av)
    return [torch.empty_like(t) for t, n in zip(inputs, needs) if n]


def _setup_context(ctx, inputs, output):
    *tensors, spec = inputs
    out, lse = output
    ctx.spec = spec
    ctx.present = [t is not None for t in tensors]
    ctx.save_for_backward(*(t for t in tensors if t is not None), out, lse)


def _backward(ctx, grad_out, grad_lse):
    _refuse_legacy_vmap((grad_out, grad_lse), "backward")
    saved = list(ctx.saved_tensors)
    out, lse = saved[-2:]
    it = iter(saved[:-2])
    tensors = [next(it) if p else None for p in ctx.present]
    needs = [bool(n) and p for n, p in zip(ctx.needs_input_grad[:7], ctx.present)]
    grads = torch.ops.haloattn.attention_backward(grad_out, grad_lse, *tensors, out, lse, ctx.spec, needs)
    it = iter(grads)
    grads = [next(it) if n else None for n in needs]
    if second_order.recorded(tensors, grad_out, grad_lse):  # create_graph=True, eagerly under a mode
        grads = second_order.first_order_only(grads, (*tensors, grad_out, grad_lse), second_order.CUSTOM_OP_REFUSED)
    return (*grads, None)


attention_op.register_autograd(_backward, setup_context=_setup_context)


def compiled_attention(tensors: Sequence[Optional[torch.Tensor]], options: dict):
    """The call as a custom op: while torch.compile traces, on meta tensors, and under a dispatch
    mode (FlopCounterMode, FakeTensorMode), which then sees one op with a fake implementation and a
    FLOP count instead of a backend's insides."""
    key = spec_key((tuple(options), tuple(options.values())))
    return torch.ops.haloattn.attention(*tensors, key)

