"""Where the neighbourhood kernels call a problem's score_mod and mask_mod (mod_codegen's device
functions SCORE_MOD, SCORE_MOD_GRAD, MASK_MOD, constexpr arguments of the kernels).

The mods see what SEMANTICS.md section 5 gives them: the batch and query-head index, flat token
indices (row-major over the grid; additional token e is ``tokens + e``) and the score after
scale and rpb, before softcap. The kernels evaluate them on every pair of a tile, including pairs
outside the pattern or the grid, which are masked afterwards: such pairs get indices clamped into
the grid, so a mod never sees an index no token has.
"""

import triton
import triton.language as tl

from .scores import log2_scores


@triton.jit
def flat_tokens(g0, g1, g2, x0, x1, x2, Lg0, Lg1, Lg2, D0, D1, D2, L1, L2, WIDE: tl.constexpr):
    """Flat token indices of group coordinates (x0, x1, x2) in dilation group (g0, g1, g2),
    clamped into the grid; int64 with WIDE (problems whose flat indices' products may pass 2^31)."""
    c0 = g0 + D0 * tl.minimum(tl.maximum(x0, 0), Lg0 - 1)
    c1 = g1 + D1 * tl.minimum(tl.maximum(x1, 0), Lg1 - 1)
    c2 = g2 + D2 * tl.minimum(tl.maximum(x2, 0), Lg2 - 1)
    if WIDE:
        c0, c1, c2 = c0.to(tl.int64), c1.to(tl.int64), c2.to(tl.int64)
    return (c0 * L1 + c1) * L2 + c2


@triton.jit
def extra_tokens(e, E, L0, L1, L2, WIDE: tl.constexpr):
    """Flat indices of additional tokens ``e`` (clamped to the last one past ``E``)."""
    flat = L0 * L1 * L2 + tl.minimum(e, E - 1)
    if WIDE:
        flat = flat.to(tl.int64)
    return flat


@triton.jit
def modded_scores(qk, bias, scale, softcap, b, h, q_flat, kv_flat, T0, T1, T2, T3,
                  HAS_BIAS: tl.constexpr, HAS_SOFTCAP: tl.constexpr, SCORE_MOD: tl.constexpr,
                  SCORE_MOD_GRAD: tl.constexpr, GRADIENT: tl.constexpr):
    """scores.finish_scores with score_mod between the bias and softcap: log2-domain scores,
    tanh(s / softcap) (or the modded score), and with GRADIENT d score_mod / d s at each pair
    (else 1)."""
    u = qk * scale
    if HAS_BIAS:
        u = u + bias
    s = SCORE_MOD(u, b, h, q_flat, kv_flat, T0, T1, T2, T3)
    if GRADIENT:
        slope = SCORE_MOD_GRAD(u, b, h, q_flat, kv_flat, T0, T1, T2, T3)
    else:
        slope = 1.0
    s, t = log2_scores(s, softcap, HAS_SOFTCAP)
    return s, t, slope


@triton.jit
def masked_by_mod(x, fill, b, h, q_flat, kv_flat, T0, T1, T2, T3, MASK_MOD: tl.constexpr):
    """``x`` with ``fill`` where mask_mod refuses the pair."""
    return tl.where(MASK_MOD(b, h, q_flat, kv_flat, T0, T1, T2, T3), x, fill)


@triton.jit
def massless_rows(lse2):
    """Row LSEs (log2 units) with -inf (rows without probability mass: no key seen, or every score
    sent to -inf by a score_mod; output 0) made +inf: P = exp2(s - lse) is then 0 on their pairs,
    where exp2(-inf + inf) would be NaN. The backward's and the tangent kernel's."""
    return tl.where(lse2 == float("-inf"), float("inf"), lse2)
