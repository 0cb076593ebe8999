"""Device functions that generated score_mod / mask_mod code (mod_codegen) calls where PyTorch's
meaning of an operator differs from Triton's: integer ``//`` and ``%`` truncate in Triton and
round towards -inf in PyTorch, tanh and sigmoid need no libdevice (the CPU interpreter runs them
too), and a captured tensor's element is read under a bounds mask (the kernels evaluate a mod on
every pair of a tile, including pairs outside the pattern that are masked afterwards, whose
indices the user's tables need not cover).
"""

import triton
import triton.language as tl

from .scores import tanh as _tanh


@triton.jit
def floor_divide(a, b):
    """``torch.floor_divide``: the quotient rounded towards -inf (floats and integers)."""
    if a.dtype.is_floating() or b.dtype.is_floating():
        q = tl.floor(a / b)
    else:
        q = a // b
        q = q - ((a % b != 0) & ((a < 0) != (b < 0))).to(q.dtype)
    return q


@triton.jit
def remainder(a, b):
    """``torch.remainder``: the remainder with the divisor's sign."""
    if a.dtype.is_floating() or b.dtype.is_floating():
        r = a - tl.floor(a / b) * b
    else:
        r = a % b
        r = r + tl.where((r != 0) & ((r < 0) != (b < 0)), b, 0)
    return r


@triton.jit
def truncate_divide(a, b):
    """``torch.div(..., rounding_mode="trunc")``."""
    if a.dtype.is_floating() or b.dtype.is_floating():
        q = a / b
        q = tl.where(q < 0, tl.ceil(q), tl.floor(q))
    else:
        q = a // b
    return q


@triton.jit
def fmod(a, b):
    """``torch.fmod``: the remainder with the dividend's sign (C's)."""
    if a.dtype.is_floating() or b.dtype.is_floating():
        r = a - truncate_divide(a, b) * b
    else:
        r = a % b
    return r


@triton.jit
def true_divide(a, b):
    """``torch.div`` without rounding: integers divide as float32 (PyTorch's default dtype)."""
    if not a.dtype.is_floating():
        a = a.to(tl.float32)
    if not b.dtype.is_floating():
        b = b.to(tl.float32)
    return a / b


@triton.jit
def tanh(x):
    return _tanh(x.to(tl.float32))


@triton.jit
def sigmoid(x):
    return 1.0 / (1.0 + tl.exp(-x.to(tl.float32)))


@triton.jit
def sign(x):
    return (x > 0).to(x.dtype) - (x < 0).to(x.dtype)


@triton.jit
def as_float(x):
    if not x.dtype.is_floating():
        x = x.to(tl.float32)
    return x


@triton.jit
def gather(base, offset, numel):
    """One element of a captured tensor per pair: ``base[offset]``, 0 where ``offset`` lies
    outside the tensor (a pair the pattern masks may index past a table sized for the pairs it
    attends)."""
    inside = (offset >= 0) & (offset < numel)
    return tl.load(base + tl.where(inside, offset, 0), mask=inside, other=0)
