"""A GPU check for problems whose tensors hold more than 2^31 elements, so that every element
offset a kernel computes must be 64-bit (NATTEN #335 and #347 are such overflows, the second one
silent). Shared by the test files of the fused backends.

The whole problem runs through the backend; the reference backend then runs in float64 on a slice
of the last batch element's trailing rows along the first spatial axis (the rows with the largest
offsets), and only the rows whose windows and inverse windows lie inside the slice are compared."""

from __future__ import annotations

import torch

import haloattn
import oracle


def check_past_int32_offsets(backend: str, spatial: tuple, window: int, batch: int = 2, heads: int = 128,
                             head_dim: int = 128, tail: int = 256) -> None:
    assert batch * heads * head_dim * torch.Size(spatial).numel() > 2**31
    gen = torch.Generator(device="cuda").manual_seed(2)
    q, k, v = (torch.randn(batch, *spatial, heads, head_dim, device="cuda", generator=gen, dtype=torch.bfloat16)
               for _ in range(3))
    last = spatial[0]
    rows = slice(last - tail, last)
    tol = oracle.TOLERANCE[torch.bfloat16]

    def tail_of(t):  # the last batch element's trailing rows, as the reference's float64 input
        return t.detach()[batch - 1:, rows].double()

    out = haloattn.attention(q, k, v, window, backend=backend)
    ref = haloattn.attention(*(tail_of(t) for t in (q, k, v)), window, backend="reference")
    # The slice's own first row shifts windows only within `window` rows of it.
    err = oracle.rel_error(out[batch - 1:, last - tail + window:].double(), ref[:, window:])
    assert err <= tol, f"out: {err}"
    del out, ref

    leaves = [t.requires_grad_(True) for t in (q, k, v)]
    out = haloattn.attention(*leaves, window, backend=backend)
    grad = torch.zeros_like(out)
    grad[batch - 1, rows] = torch.randn(tail, *out.shape[2:], device="cuda", generator=gen, dtype=torch.bfloat16)
    grads = torch.autograd.grad(out, leaves, grad)
    del out
    ref_leaves = [tail_of(t).requires_grad_(True) for t in (q, k, v)]
    ref_out = haloattn.attention(*ref_leaves, window, backend="reference")
    ref_grads = torch.autograd.grad(ref_out, ref_leaves, grad[batch - 1:, rows].double())
    inner = slice(2 * window, tail)  # keys near the slice's start are also seen by queries before it
    for name, g, rg in zip(("dq", "dk", "dv"), grads, ref_grads):
        err = oracle.rel_error(g[batch - 1:, rows][:, inner].double(), rg[:, inner])
        assert err <= tol, f"{name}: {err}"
