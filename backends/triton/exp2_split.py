"""exp2 with part of the work moved from the multi-function unit to the FMA pipe.

Where heads are narrow the forward's softmax, not the tensor cores, sets the pace: a 128 x 128
tile at 64 channels is 4.2 MFLOP of products (about 1024 cycles of a Hopper multiprocessor's
tensor cores) and 16384 exp2s, which its multi-function units (16 a cycle) also need 1024 cycles
for; at 32 channels the exp2s take twice the products' time. FlashAttention-4 moves some of them
to the FMA pipe, which has cycles to spare: 2^x = 2^n * 2^f, n = round(x), f in [-1/2, 1/2],
2^f by a polynomial, 2^n added to the result's exponent bits.

``exp2_split(x, EVERY)`` (a Triton function; the Gluon kernels call it too) computes one exp2 in
EVERY that way (EVERY = 2 or 4; 0: all on the multi-function unit) in one inline-PTX block over
EVERY consecutive elements of a thread, which ptxas schedules with the rest of the step. The
polynomial (degree 3, 1 + f (C1 + f (C2 + f C3)), coefficients fitted for relative error; at most
1.02e-4 on [-1/2, 1/2]) is far below what the 16-bit probabilities that leave the softmax carry
(2^-9), and its constant term is exactly 1, so:

* x = 0 (a row's maximum) gives exactly 1;
* x is clamped at -127 first, where n = -127, f = 0 and the exponent sum is 0: exactly +0.0, so
  scores masked to -inf still contribute nothing (rows that saw no key keep a zero sum);
* -127 < x < -126 gives values below 2^-126 (denormal bit patterns): nothing a float32 sum of
  terms up to 1 notices. ex2.approx.ftz flushes these to 0.

``exp2_split_reference`` is the same arithmetic on the host in float32 (torch), which the CPU
tests hold to the float64 exp2; the GPU tests hold the PTX to the same bounds.
Only for 16-bit attention: float32 heads keep every exp2 on the multi-function unit. The Triton
forward's default splits nothing (tiles.EXP2_SPLIT_EVERY says why: its step is bound by issue as
much as by the exp2 units); configs name a split with ``"exp2_split"``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# 2^f ~ 1 + f (C1 + f (C2 + f C3)) on [-1/2, 1/2] (a weighted least-squares fit of the relative
# error, iterated to equal ripple: benchmarks/../tests/test_exp2_split.py checks the bound).
C1, C2, C3 = 0.6932829287944439, 0.24221097199195177, 0.055008929662397954
# Rounding to an integer by adding 1.5 * 2^23: the sum's low mantissa bits then hold round(x).
ROUNDER = 12582912.0
FLOOR = -127.0  # where 2^n's exponent bits reach 0: the result is exactly 0 there
MAX_RELATIVE_ERROR = 1.02e-4  # of the polynomial on [-1/2, 1/2], in exact arithmetic


def _f32(value: float) -> str:
    """A float32 constant as PTX writes one: 0f and its 8 hex digits."""
    return "0f%08X" % int(torch.tensor([value], dtype=torch.float32).view(torch.int32).item() & 0xFFFFFFFF)


def _polynomial_ptx(out: str, x: str) -> str:
    """PTX for out = 2^x on the FMA pipe (see the module docstring)."""
    return (f"max.ftz.f32 x, {x}, {_f32(FLOOR)};\n"
            f"add.rn.ftz.f32 t, x, {_f32(ROUNDER)};\n"
            f"sub.rn.ftz.f32 n, t, {_f32(ROUNDER)};\n"
            "sub.rn.ftz.f32 f, x, n;\n"
            f"fma.rn.ftz.f32 p, f, {_f32(C3)}, {_f32(C2)};\n"
            f"fma.rn.ftz.f32 p, p, f, {_f32(C1)};\n"
            f"fma.rn.ftz.f32 p, p, f, {_f32(1.0)};\n"
            "mov.b32 e, t;\n"
            "shl.b32 e, e, 23;\n"  # round(x) << 23, two's complement: 2^n's exponent bits
            "mov.b32 r, p;\n"
            f"add.s32 {out}, r, e;\n")


def split_ptx(every: int) -> str:
    """The inline PTX for ``every`` consecutive elements: the last on the FMA pipe, the others
    through ex2.approx.ftz (one MUFU.EX2 each, as tl.math.exp2 of a float32 lowers)."""
    body = "".join(f"ex2.approx.ftz.f32 ${i}, ${every + i};\n" for i in range(every - 1))
    return ("{\n.reg .f32 x, t, n, f, p;\n.reg .b32 e, r;\n" + body
            + _polynomial_ptx(f"${every - 1}", f"${2 * every - 1}") + "}")


_SPLIT_2 = tl.constexpr(split_ptx(2))
_SPLIT_4 = tl.constexpr(split_ptx(4))
_CONSTRAINTS_2 = tl.constexpr("=r,=r,r,r")
_CONSTRAINTS_4 = tl.constexpr("=r,=r,=r,=r,r,r,r,r")


@triton.jit
def exp2_split(x, EVERY: tl.constexpr):
    """2^x of float32 ``x``, one element in EVERY (2 or 4) on the FMA pipe; EVERY = 0: tl.math.exp2."""
    if EVERY == 0:
        out = tl.math.exp2(x)
    elif EVERY == 2:
        out = tl.inline_asm_elementwise(_SPLIT_2, _CONSTRAINTS_2, [x], dtype=tl.float32, is_pure=True, pack=2)
    else:
        tl.static_assert(EVERY == 4, "exp2_split: EVERY is 0, 2 or 4")
        out = tl.inline_asm_elementwise(_SPLIT_4, _CONSTRAINTS_4, [x], dtype=tl.float32, is_pure=True, pack=4)
    return out


def exp2_split_reference(x: torch.Tensor, every: int) -> torch.Tensor:
    """The kernels' arithmetic in float32 on the host: element i of each run of ``every`` along
    the last axis through the polynomial when i = every - 1, the others through torch.exp2."""
    x = x.to(torch.float32)
    clamped = torch.clamp(x, min=FLOOR)
    t = clamped + torch.tensor(ROUNDER, dtype=torch.float32)
    n = t - torch.tensor(ROUNDER, dtype=torch.float32)
    f = clamped - n
    p = f * C3 + C2
    p = p * f + C1
    p = p * f + 1.0
    bits = p.view(torch.int32) + torch.bitwise_left_shift(t.view(torch.int32), 23)
    polynomial = bits.view(torch.float32)
    if every == 0:
        return torch.exp2(x)
    lanes = torch.arange(x.shape[-1], device=x.device) % every == every - 1
    return torch.where(lanes, polynomial, torch.exp2(x))
