"""Backend ``triton``'s key-query convolution kernels on a CUDA GPU, against the float64 oracle:
random rank-1 problems in every dtype (the products the interpreter cannot run: TF32 band
products, float16 / bfloat16 operands, descriptor-free pointer loads), MTA's kernel on a
longer sequence, bitwise-repeatable gradients, and wide float32 heads, whose tiles the launcher
refits to the GPU's shared memory. Run with ``pytest -m gpu``."""

import random

import pytest
import torch

import haloattn
from kq_conv_check import check_kq_conv

gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def random_kq_problem(rng: random.Random) -> dict:
    length = rng.randint(40, 700)
    pattern = rng.choice(("neighborhood", "neighborhood", "window"))
    dilation = rng.choice((1, 1, 2, 3))
    group = length // dilation
    window = rng.randint(2, max(2, min(group, 200)))
    options = dict(length=length, window=window, pattern=pattern, dilation=dilation,
                   causal=rng.random() < 0.5, kernel=(rng.randint(1, 8), rng.choice((1, 3, 5, 11, 21))))
    if pattern == "neighborhood":
        options["stride"] = rng.randint(1, window)
    elif rng.random() < 0.5:
        options["shift"] = rng.randint(0, window - 1)
    heads = rng.choice((1, 2, 4))
    options.update(heads=heads, kv_heads=rng.choice([h for h in (1, 2, 4) if heads % h == 0]),
                   head_dim=rng.choice((16, 32, 64, 80, 128)), batch=rng.choice((1, 2)))
    options["value_dim"] = rng.choice((options["head_dim"], 64))
    if rng.random() < 0.3:
        options["softcap"] = rng.choice((2.0, 10.0))
    if rng.random() < 0.3:
        options["rpb"], options["frozen"] = True, ("rpb",)
    return options


@gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("seed", range(10))
def test_random_problems(dtype, seed):
    options = random_kq_problem(random.Random(seed * 3 + {torch.bfloat16: 0, torch.float16: 1, torch.float32: 2}[dtype]))
    length, window = options.pop("length"), options.pop("window")
    check_kq_conv(length, window, dtype=dtype, device="cuda", seed=seed, **options)


@gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_mta_kernel_on_a_longer_sequence(dtype):
    check_kq_conv(2048, 511, dtype=dtype, device="cuda", causal=True, kernel=(6, 11), heads=4, kv_heads=2,
                  head_dim=128)


@gpu
@needs_cuda
def test_wide_float32_heads_fit_after_refits():
    check_kq_conv(300, 63, dtype=torch.float32, device="cuda", kernel=(4, 7), head_dim=256, heads=2)


@gpu
@needs_cuda
def test_gradients_are_bitwise_repeatable():
    gen = torch.Generator(device="cuda").manual_seed(5)
    q, k, v = (torch.randn(2, 900, 4, 64, device="cuda", generator=gen, dtype=torch.bfloat16) for _ in range(3))
    weight = torch.randn(4, 6, 11, device="cuda", generator=gen) * 0.3
    leaves = [t.requires_grad_(True) for t in (q, k, v, weight)]
    grad = torch.randn(2, 900, 4, 64, device="cuda", generator=gen, dtype=torch.bfloat16)

    def grads():
        out = haloattn.attention(*leaves[:3], 255, kq_conv=leaves[3], causal=True, backend="triton")
        return torch.autograd.grad(out, leaves, grad)

    first, second = grads(), grads()
    for a, b in zip(first, second):
        assert torch.equal(a, b)
