"""The reference backend is memory-bounded: a 2-D 256x256 grid, window 13x13, batch 1, 4 heads,
head_dim 32 runs forward and backward with a peak-RSS growth far below one N x N score matrix
(N = 65536: 16 GiB per head in float32). Runs in a subprocess so ru_maxrss measures this alone."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.usefixtures("plain_cpu_environment")


SCRIPT = textwrap.dedent("""
    import json, math, resource, torch, haloattn
    torch.manual_seed(0)
    L, K, H, D = 256, 13, 4, 32
    q, k, v = (torch.randn(1, L, L, H, D, requires_grad=True) for _ in range(3))
    # warm up (imports, dispatch, allocator) on a small grid, then measure the big one
    small = torch.randn(1, 16, 16, H, D)
    haloattn.attention(small, small, small, K, backend="reference")
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    out = haloattn.attention(q, k, v, K, backend="reference")
    grad = torch.randn_like(out)
    out.backward(grad)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    # spot-check rows against a direct float64 computation of SEMANTICS section 3
    def start(i):
        return min(max(i - K // 2, 0), L - K)
    errors = []
    for (i, j) in [(0, 0), (5, 200), (128, 128), (255, 3), (250, 255)]:
        r0, c0 = start(i), start(j)
        kk = k[0, r0:r0 + K, c0:c0 + K].reshape(K * K, H, D).double()
        vv = v[0, r0:r0 + K, c0:c0 + K].reshape(K * K, H, D).double()
        s = torch.einsum("hd,khd->hk", q[0, i, j].double(), kk) * D ** -0.5
        ref = torch.einsum("hk,khd->hd", torch.softmax(s, -1), vv)
        errors.append(((out[0, i, j].double() - ref).norm() / ref.norm()).item())
    print("RESULT=" + json.dumps(dict(
        growth=peak - base, errors=errors,
        grads_finite=all(bool(torch.isfinite(t.grad).all()) for t in (q, k, v)),
        grads_nonzero=all(bool(t.grad.abs().sum() > 0) for t in (q, k, v)),
    )))
""")


def test_reference_256x256_window_13_forward_backward_bounded_memory():
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads([ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT=")][-1][7:])
    n = 256 * 256
    score_matrix = n * n * 4  # one head, float32: 16 GiB
    assert result["growth"] < score_matrix / 8, f"peak RSS grew by {result['growth'] / 2**30:.2f} GiB"
    assert result["growth"] < 3 * 2**30
    assert max(result["errors"]) < 1e-5, result["errors"]
    assert result["grads_finite"] and result["grads_nonzero"]
