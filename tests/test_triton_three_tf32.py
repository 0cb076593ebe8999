"""scores.three_tf32_mma (float32 products in three TF32 parts, written out because Triton 3.6's own
"tf32x3" miscompiles in 8-warp kernels on sm_90) in Triton's interpreter: the parts' split and the
product against float64. The interpreter multiplies "tf32" operands in full float32, so what this
checks is the split and the terms summed; tests/test_triton_kq_conv_gpu.py checks the rounding on a
GPU, where TF32 drops the low part's own low bits."""

import pytest
import torch

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from haloattn.backends.triton import interpreter_compat  # noqa: E402
from haloattn.backends.triton.scores import mma, tf32_parts  # noqa: E402


@pytest.fixture(autouse=True)
def interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


@triton.jit
def _parts_kernel(X, HIGH, LOW, N: tl.constexpr):
    i = tl.arange(0, N)
    high, low = tf32_parts(tl.load(X + i))
    tl.store(HIGH + i, high)
    tl.store(LOW + i, low)


@triton.jit
def _product_kernel(A, B, C, M: tl.constexpr, K: tl.constexpr, N: tl.constexpr):
    m, k, n = tl.arange(0, M), tl.arange(0, K), tl.arange(0, N)
    a = tl.load(A + m[:, None] * K + k[None, :])
    b = tl.load(B + k[:, None] * N + n[None, :])
    c = mma(a, b, tl.zeros([M, N], dtype=tl.float32), "three_tf32")
    tl.store(C + m[:, None] * N + n[None, :], c)


def _random(*shape, seed):
    gen = torch.Generator().manual_seed(seed)
    # magnitudes over many binades, both signs: every mantissa pattern the split must cut
    return torch.randn(*shape, generator=gen) * torch.exp2(torch.randint(-20, 20, shape, generator=gen).float())


def test_high_part_keeps_tf32s_bits_and_low_part_the_rest():
    x = _random(256, seed=1)
    high, low = torch.empty_like(x), torch.empty_like(x)
    interpreter_compat.kernel(_parts_kernel)[(1,)](x, high, low, N=256)
    assert torch.equal(high + low, x)  # exact: low is x - high in float32
    assert (high.view(torch.int32) & 0x1FFF).eq(0).all()  # TF32 takes the high part whole
    assert (low.abs() < x.abs() * 2.0 ** -10).all()  # and the low part is below its last bit
    assert (high.view(torch.int32) ^ x.view(torch.int32)).lt(0x2000).all()  # sign and exponent kept


def test_three_part_product_matches_float64():
    a, b = _random(32, 64, seed=2), _random(64, 16, seed=3)
    c = torch.empty(32, 16)
    interpreter_compat.kernel(_product_kernel)[(1,)](a, b, c, M=32, K=64, N=16)
    ref = a.double() @ b.double()
    # float32 accumulation of 64 terms over a 2^40 range of magnitudes: relative to the terms' size
    scale = (a.double().abs() @ b.double().abs())
    assert ((c.double() - ref).abs() <= 1e-6 * scale).all()
