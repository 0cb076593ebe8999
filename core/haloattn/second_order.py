"""Second derivatives: a backward run with ``create_graph=True`` (gradient penalties, Hessian-vector
products, meta-learning's inner steps) whose gradients are differentiated again.

A backend that declares ``twice_differentiable`` (the reference) records its backward on autograd,
so the gradients it returns carry a graph back to the inputs and to dO / dLSE. Every other backend's
gradients are first order: they are returned through :class:`_FirstOrderOnly`, a graph node that
depends on everything they depend on (inputs, dO, dLSE) and raises if a second derivative ever
flows into it. (``torch.autograd.function.once_differentiable``, used before, attaches its error
node only when dO or dLSE require a gradient, and then to detached copies of the gradients: a
``torch.autograd.grad(..., inputs)`` that asks for the inputs prunes it, so the attention's share
of the second derivative was left out without a word.)
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch

SECOND_DERIVATIVE_REFUSED = (
    "haloattn.attention: a second derivative (a backward through gradients taken with "
    "create_graph=True: a gradient penalty, a Hessian-vector product) reached the gradients of a call "
    "that backend '{name}' computed; its backward is first order. Run that call with "
    "backend='reference' (twice differentiable, unfused: slower, memory grows with tokens x window), "
    "or detach what is differentiated twice."
)
CUSTOM_OP_REFUSED = (
    "haloattn.attention: a second derivative (a backward through gradients taken with "
    "create_graph=True) reached the gradients of a call that ran as the custom op haloattn::attention "
    "(meta or fake tensors, a dispatch mode such as FlopCounterMode, torch.compile), whose backward is "
    "first order. Take second derivatives eagerly, on real tensors, with backend='reference'."
)


def recorded(tensors: Sequence[Optional[torch.Tensor]], grad_out, grad_lse) -> bool:
    """Whether this backward is being recorded for a second derivative: grad mode is on inside a
    backward only under ``create_graph=True``, and it matters only if something the gradients
    depend on (the inputs, dO, dLSE) requires a gradient."""
    return torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (*tensors, grad_out, grad_lse))


class _FirstOrderOnly(torch.autograd.Function):
    """Identity on first-order gradients, whose backward refuses (see the module docstring)."""

    @staticmethod
    def forward(ctx, message: str, count: int, *tensors):
        ctx.message = message
        return tuple(g.view_as(g) for g in tensors[:count])

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError(ctx.message)


def first_order_only(grads: Sequence[Optional[torch.Tensor]], depends_on: Sequence[Optional[torch.Tensor]],
                     message: str):
    """``grads`` (None where an input needs none), each with a graph node made to depend on
    ``depends_on`` that raises ``message`` if differentiated."""
    present = [g for g in grads if g is not None]
    if not present:
        return tuple(grads)
    deps = [t for t in depends_on if t is not None and t.requires_grad]
    wrapped = iter(_FirstOrderOnly.apply(message, len(present), *present, *deps))
    return tuple(next(wrapped) if g is not None else None for g in grads)


def gradients(backend, problem, inputs, grad_out, grad_lse, needs: Sequence[bool],
              first_order: Callable[[], Sequence[Optional[torch.Tensor]]]):
    """The backward under ``create_graph=True``: recorded by a twice-differentiable backend, else
    ``first_order()`` (run without recording) behind :class:`_FirstOrderOnly`."""
    if backend.twice_differentiable:
        return backend.differentiable_backward(problem, inputs, grad_out, grad_lse, needs)
    with torch.no_grad():
        grads = first_order()
    return first_order_only(grads, (*inputs, grad_out, grad_lse), SECOND_DERIVATIVE_REFUSED.format(name=backend.name))
