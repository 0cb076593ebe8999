"""The forward + backward call the benchmarks time.

A call built here runs the forward and returns the gradients of its leaves through
torch.autograd.grad, not ``.backward()``: nothing accumulates into ``.grad``. With
``.backward()`` a CUDA-graph capture adds each replay's gradients into the tensors left by the
warm-up (an extra read and write of every input), work no attention kernel does; on the 2-D
neighbourhood problems that was 0.2-0.3 ms of a 2 ms call (bench_neighborhood.py's graph figures
before 2026-12-05 carry it). do_bench's ``grad_to_none`` avoided it outside graphs; this call
needs no reset in either timing method, so both time the same work.
"""

from __future__ import annotations

import torch


def forward_backward(forward, leaves, grad_out):
    """A call running ``forward()`` and its backward into gradients of every leaf, returned."""
    def step():
        return torch.autograd.grad(forward(), leaves, grad_out)
    return step
