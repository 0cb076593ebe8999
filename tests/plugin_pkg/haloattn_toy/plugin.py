"""A toy backend: runs the reference computation, but only on rank-1 grids, with a priority
above the reference backend, and counts its calls so tests can see that it really ran."""

from haloattn import Backend, hookimpl
from haloattn.backends.reference import attend

CALLS = {"forward": 0, "backward": 0}


class ToyBackend(Backend):
    name = "toy"
    priority = 10000  # above every built-in backend, so the tests do not depend on the machine
    description = "test-only: reference math on rank-1 grids"

    def not_supported_reasons(self, problem):
        reasons = []
        if problem.rank != 1:
            reasons.append(f"toy runs rank-1 grids only; this one has rank {problem.rank}")
        if problem.kq_conv_shape is not None:
            reasons.append("toy has no kq_conv")
        return reasons

    def configs(self, problem):
        return [{"variant": 0}, {"variant": 1}]

    def forward(self, problem, inputs, config=None):
        CALLS["forward"] += 1
        return attend.forward(problem, inputs)

    def backward(self, problem, inputs, out, lse, grad_out, grad_lse, needs_grad, config=None):
        CALLS["backward"] += 1
        return attend.backward(problem, inputs, grad_out, grad_lse, needs_grad)


@hookimpl
def haloattn_register_backends(registry):
    registry.add(ToyBackend())
