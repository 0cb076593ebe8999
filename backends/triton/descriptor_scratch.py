"""The global buffer Triton asks for when a kernel builds tensor descriptors (TMA) on the device.

Triton finds its allocator in a context variable: it is set per thread. A launch plan built (and
first run) in one thread, where ``ensure_allocator`` set it, may later run in another: autograd
runs a backward on its own device thread, a server calls the forward from a thread pool. Every
launch of a kernel that needs the buffer therefore makes sure the current thread has an allocator
(fast_launch.Launch), at the cost of one context-variable read.
"""

from __future__ import annotations

import torch
import triton


def allocate(size: int, alignment: int, stream) -> torch.Tensor:
    # Descriptors built inside a kernel live in a small buffer Triton asks for per launch; it is
    # taken on the current stream, the one the kernel is launched on.
    return torch.empty(size, dtype=torch.int8, device=torch.cuda.current_device())


def has_allocator() -> bool:
    """Whether this thread has a Triton allocator (ours or the caller's own, which is kept); on a
    Triton without this internal, assume not."""
    try:
        from triton.runtime import _allocation

        return not isinstance(_allocation._allocator.get(), _allocation.NullAllocator)
    except (ImportError, AttributeError):
        return False


def ensure_allocator() -> None:
    """Give this thread our allocator unless it has one."""
    if not has_allocator():
        triton.set_allocator(allocate)
