"""A test backend that runs every problem through the reference's forward and backward, for
tests about the dispatcher (priorities, rules, contracts) rather than about a kernel."""

import haloattn
from haloattn.dispatch import DISPATCHER


class ReferenceDelegate(haloattn.Backend):
    def not_supported_reasons(self, problem):
        return []

    def forward(self, problem, inputs, config=None):
        return DISPATCHER.get("reference").forward(problem, inputs, config)

    def backward(self, problem, inputs, out, lse, grad_out, grad_lse, needs_grad, config=None):
        return DISPATCHER.get("reference").backward(problem, inputs, out, lse, grad_out, grad_lse, needs_grad, config)
