"""Rounding to the nearest TF32 value, which the key-query convolution's TF32 products take their
operands through (kq_conv_launch.tf32_nearest on the host, kq_conv_scores.tf32_nearest in the
kernels; the interpreter multiplies in float32, so only a GPU shows the products' rounding, in
tests/test_triton_kq_conv_gpu.py): against an independent rounding in float64, and the two
implementations bit for bit."""

import pytest
import torch

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from haloattn.backends.triton import interpreter_compat, kq_conv_launch  # noqa: E402
from haloattn.backends.triton.kq_conv_scores import tf32_nearest  # noqa: E402


@pytest.fixture(autouse=True)
def interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


@triton.jit
def _nearest_kernel(X, Y, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(Y + i, tf32_nearest(tl.load(X + i)))


def _random(n, seed):
    gen = torch.Generator().manual_seed(seed)
    # many binades, both signs, and values exactly half a TF32 step above a TF32 value (ties)
    x = torch.randn(n, generator=gen) * torch.exp2(torch.randint(-30, 30, (n,), generator=gen).float())
    ties = (x[: n // 8].view(torch.int32) & ~0x1FFF) | 0x1000
    return torch.cat([x[n // 8:], ties.view(torch.float32)])


def _nearest_in_float64(x):
    """Nearest multiple of x's TF32 step (2^(exponent - 10)), ties away from zero."""
    x = x.double()
    step = torch.exp2(torch.floor(torch.log2(x.abs())) - 10)
    return torch.sign(x) * torch.floor(x.abs() / step + 0.5) * step


def test_host_rounding_is_the_nearest_tf32_value():
    x = _random(4096, seed=1)
    r = kq_conv_launch.tf32_nearest(x)
    assert (r.view(torch.int32) & 0x1FFF).eq(0).all()
    assert torch.equal(r.double(), _nearest_in_float64(x))
    assert ((r.double() - x.double()).abs() <= 2.0 ** -11 * x.double().abs()).all()


def test_kernel_rounding_matches_the_host_bit_for_bit():
    x = _random(1024, seed=2)
    y = torch.empty_like(x)
    interpreter_compat.kernel(_nearest_kernel)[(1,)](x, y, N=1024)
    assert torch.equal(y.view(torch.int32), kq_conv_launch.tf32_nearest(x).view(torch.int32))


def test_bands_for_tf32_products_are_rounded():
    weight = torch.randn(2, 3, 5, generator=torch.Generator().manual_seed(3))
    plain = kq_conv_launch.conv_bands(weight, 16, 16, "ieee")
    rounded = kq_conv_launch.conv_bands(weight, 16, 16, "tf32")
    assert torch.equal(plain, kq_conv_launch.toeplitz_bands(weight, 16, 16, torch.float32))
    assert torch.equal(rounded, kq_conv_launch.tf32_nearest(plain)) and not torch.equal(rounded, plain)
