"""What a backend is: a name, a priority, reasons it cannot run a Problem, tuning configs, and a
forward/backward pair. Built-in and third-party backends subclass :class:`Backend` and hand an
instance to the registry (see hookspecs.py)."""

from __future__ import annotations

import contextlib
import functools
from typing import List, NamedTuple, Optional, Sequence

import torch

from .problem import Problem


class AttentionInputs(NamedTuple):
    """The tensors of one call. Optional ones are None when absent. Layouts as in SEMANTICS.md."""

    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    rpb: Optional[torch.Tensor] = None
    kq_conv: Optional[torch.Tensor] = None
    additional_keys: Optional[torch.Tensor] = None
    additional_values: Optional[torch.Tensor] = None


Config = Optional[dict]


class Backend:
    """Base class of every backend.

    Subclasses set ``name`` and ``priority`` (higher runs first when several can run) and
    implement ``not_supported_reasons``, ``forward`` and ``backward``. ``forward`` returns the
    output ``[B, *spatial, H, D_v]`` in the query's dtype and the LSE ``[B, *spatial, H]`` (float32;
    float64 for float64 inputs); ``backward`` returns
    one gradient per entry of :class:`AttentionInputs` (None where the input is absent).
    """

    name: str = "unnamed"
    priority: int = 0
    description: str = ""

    def available(self) -> List[str]:
        """Reasons this backend cannot run on this machine at all (empty if it can)."""
        return []

    def not_supported_reasons(self, problem: Problem) -> List[str]:
        """Human sentences saying why ``problem`` cannot run here; empty means it can."""
        raise NotImplementedError

    def configs(self, problem: Problem) -> Sequence[Config]:
        """Tuning candidates for ``problem``; ``None`` stands for the backend's own heuristic."""
        return [None]

    def forward(self, problem: Problem, inputs: AttentionInputs, config: Config = None):
        raise NotImplementedError

    def backward(
        self,
        problem: Problem,
        inputs: AttentionInputs,
        out: torch.Tensor,
        lse: torch.Tensor,
        grad_out: torch.Tensor,
        grad_lse: Optional[torch.Tensor],
        needs_grad: Sequence[bool],
        config: Config = None,
    ):
        """One gradient per entry of ``inputs`` (None where ``needs_grad`` is false). ``grad_out``
        and ``grad_lse`` never arrive expanded (no zero strides): the core materialises them."""
        raise NotImplementedError

    # Optional: forward-mode AD (torch.func.jvp, torch.autograd.forward_ad). A backend that has a
    # rule implements both methods; the dispatcher then picks among those backends whenever a
    # call carries tangents (see Dispatcher.verdict).
    def jvp_not_supported_reasons(self, problem: Problem) -> List[str]:
        """Why ``jvp`` cannot run ``problem`` (empty: it can). Asked only of backends that can run
        the problem's forward."""
        return ["no JVP rule"]

    def jvp(
        self,
        problem: Problem,
        inputs: AttentionInputs,
        tangents: AttentionInputs,
        out: torch.Tensor,
        lse: torch.Tensor,
        config: Config = None,
    ):
        """(tangent of out, tangent of lse) for the inputs' ``tangents`` (None where an input has
        none), given the forward's ``out`` and ``lse``. The out tangent has out's dtype; the lse
        tangent is float32 (float64 for float64 inputs), 0 on rows that saw no key."""
        raise NotImplementedError

    # Optional: a backend that can keep its forward's own autograd graph for the backward (rather
    # than recompute the forward) sets ``keeps_state`` and implements the two methods below. The
    # eager path uses them when some input needs a gradient; torch.compile's custom ops, which
    # cannot carry Python state between forward and backward, use forward/backward as always.
    keeps_state: bool = False

    def forward_with_state(self, problem: Problem, inputs: AttentionInputs, needs_grad: Sequence[bool], config: Config = None):
        """(out, lse, state): as ``forward``, plus what ``backward_from_state`` needs."""
        raise NotImplementedError

    def backward_from_state(self, state, grad_out: torch.Tensor, grad_lse: Optional[torch.Tensor]):
        """One gradient per entry of :class:`AttentionInputs` from ``forward_with_state``'s state."""
        raise NotImplementedError

    # Optional: second derivatives (haloattn.second_order). A backend whose backward can be recorded
    # on autograd sets ``twice_differentiable`` and implements ``differentiable_backward``; the
    # gradients of every other backend, taken with create_graph=True, raise if differentiated again.
    twice_differentiable: bool = False

    def differentiable_backward(self, problem: Problem, inputs: AttentionInputs, grad_out: torch.Tensor,
                                grad_lse: Optional[torch.Tensor], needs_grad: Sequence[bool]):
        """As ``backward``, recorded on autograd: gradients with a graph back to ``inputs``,
        ``grad_out`` and ``grad_lse``, so that they can be differentiated again."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<haloattn backend {self.name!r} priority {self.priority}>"


def checked_outputs(backend: Backend, inputs: AttentionInputs, result):
    """``result`` as ``(out, lse)`` if it keeps the contract of :meth:`Backend.forward` (out
    ``[B, *spatial, H, D_v]`` in the query's dtype, lse ``[B, *spatial, H]`` in float32, float64
    for float64 inputs, both on the query's device); otherwise a RuntimeError naming the backend.
    The core checks a backend's first result per call signature and every result of the custom
    op, whose fake promised these shapes to torch.compile: a plugin's wrong dtype there went
    through unnoticed, and a wrong shape failed in the compiled graph, blaming the fake."""
    query = inputs.query
    want_out = (*query.shape[:-1], inputs.value.shape[-1])
    want_lse = tuple(query.shape[:-1])
    lse_dtype = torch.float64 if query.dtype == torch.float64 else torch.float32
    if isinstance(result, (tuple, list)) and len(result) == 2:
        out, lse = result
        if (isinstance(out, torch.Tensor) and isinstance(lse, torch.Tensor) and out.shape == want_out
                and lse.shape == want_lse and out.dtype == query.dtype and lse.dtype == lse_dtype
                and out.device == query.device and lse.device == query.device):
            return out, lse
        got = f"out {_described(out)} and lse {_described(lse)}"
    else:
        got = _described(result)
    raise RuntimeError(
        f"haloattn: backend {backend.name!r} returned {got} from its forward; expected (out, lse) with out "
        f"{list(want_out)} {_dtype_name(query.dtype)} and lse {list(want_lse)} {_dtype_name(lse_dtype)}, "
        f"on {query.device} (docs/plugins.md)")


def checked_gradients(backend: Backend, inputs: AttentionInputs, grads, needs_grad: Sequence[bool]):
    """``grads`` if it keeps the contract of :meth:`Backend.backward`: one entry per field of
    :class:`AttentionInputs`, a tensor shaped like its input wherever ``needs_grad`` asks for one
    (autograd reads a None there as "no gradient": the input's gradient was silently left out, and
    the custom op failed on it deep inside); otherwise a RuntimeError naming the backend."""
    if not isinstance(grads, (tuple, list)) or len(grads) != len(AttentionInputs._fields):
        raise RuntimeError(
            f"haloattn: backend {backend.name!r} returned {_described(grads)} from its backward; expected "
            f"{len(AttentionInputs._fields)} gradients, one per field of haloattn.AttentionInputs "
            "(None where needs_grad is false) (docs/plugins.md)")
    for name, grad, tensor, needed in zip(AttentionInputs._fields, grads, inputs, needs_grad):
        if needed and not (isinstance(grad, torch.Tensor) and grad.shape == tensor.shape):
            raise RuntimeError(
                f"haloattn: backend {backend.name!r} returned {_described(grad)} as the gradient of {name}, "
                f"which needs one of shape {list(tensor.shape)} (docs/plugins.md)")
    return grads


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _described(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"{list(value.shape)} {_dtype_name(value.dtype)} on {value.device}"
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)}"
    return type(value).__name__


def cuda_capability(device: torch.device) -> Optional[tuple]:
    """(major, minor) of a CUDA device, or None for other devices."""
    if device.type != "cuda":
        return None
    return torch.cuda.get_device_capability(device)


def on_device(device: torch.device):
    """Make ``device`` the current CUDA device for the block. Kernel launchers (Triton's, the CUDA
    backend's stream lookup) work on the current device, so the core enters this around every
    backend call: a backend always finds the current device to be its inputs' device, also for
    tensors on ``cuda:1`` in a process whose current device is ``cuda:0``."""
    if device.type == "cuda" and device.index is not None and device.index != torch.cuda.current_device():
        return torch.cuda.device(device)
    return contextlib.nullcontext()



@functools.lru_cache(maxsize=None)
def _autocast_keys() -> tuple:
    """torch's Autocast* dispatch keys. Looked up once: pybind11 rebuilds ``__members__`` on every
    access, which cost 6-7 ms per backward call when done inline (cProfile, H100 host, 2026-11-25)."""
    return tuple(k for k in torch._C.DispatchKey.__members__.values() if k.name.startswith("Autocast"))


@contextlib.contextmanager
def recording_autograd():
    """Record autograd even where the dispatcher has switched it off.

    A backend whose backward differentiates a recomputation with ``torch.autograd.grad`` (the
    reference does) runs inside the ``haloattn::attention_backward`` custom op under
    torch.compile, where autograd keys are excluded from dispatch. This re-includes them (keeping
    autocast off) for the duration of the block.
    """
    exclude = torch._C._dispatch_tls_local_exclude_set()
    autocast = [k for k in _autocast_keys() if exclude.has(k)]
    keep = torch._C.DispatchKeySet(autocast[0]) if autocast else torch._C.DispatchKeySet(torch._C.DispatchKey.Undefined)
    for key in autocast[1:]:
        keep = keep.add(key)
    with torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(), keep), torch.enable_grad():
        yield
