"""Registers the reference backend with haloattn's plugin manager."""

from haloattn.backend import Backend
from haloattn.hookspecs import hookimpl

from . import attend, jvp, second_order


class ReferenceBackend(Backend):
    """Runs everything, everywhere: the executable form of SEMANTICS.md and the test oracle's
    twin. Memory-bounded (gathers each query's keys chunk by chunk), not fast."""

    name = "reference"
    priority = 0
    description = "pure PyTorch, any device and dtype, every feature; memory-bounded, not fast"

    def not_supported_reasons(self, problem):
        return []

    def forward(self, problem, inputs, config=None):
        return attend.forward(problem, inputs)

    def forward_for_trace(self, problem, inputs):
        """The forward as torch.jit.trace and torch.onnx.export should record it (haloattn.tracing):
        out-of-place, blocks of consecutive rows."""
        return attend.forward_out_of_place(problem, inputs, jvp.row_blocks(problem, problem.device))

    def backward(self, problem, inputs, out, lse, grad_out, grad_lse, needs_grad, config=None):
        return attend.backward(problem, inputs, grad_out, grad_lse, needs_grad, out=out, lse=lse)

    # Its backward can be recorded on autograd: gradients taken with create_graph=True can be
    # differentiated again (haloattn.second_order).
    twice_differentiable = True

    def differentiable_backward(self, problem, inputs, grad_out, grad_lse, needs_grad):
        return second_order.differentiable_backward(problem, inputs, grad_out, grad_lse, needs_grad)

    def jvp_not_supported_reasons(self, problem):
        return []

    def jvp(self, problem, inputs, tangents, out, lse, config=None):
        return jvp.jvp(problem, inputs, tangents, lse)


@hookimpl
def haloattn_register_backends(registry):
    registry.add(ReferenceBackend())
