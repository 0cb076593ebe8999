"""Triton kernels for short-window attention (pattern "window", at most 256 tokens per window).

One program owns one attention head and one or more whole windows. A window's tokens are read in
place from the strided ``[B, *spatial, H, D]`` tensors (no roll, pad or partition copy): the
program computes the window's bounds on every axis (SEMANTICS.md section 4, geometry.window_range)
and loads a ``BLOCK``-token tile, ``BLOCK`` being the window volume rounded up to a power of two.
Tokens outside the grid (partial edge windows of a shifted or ragged axis) and the padding past the
window volume are masked. The whole ``BLOCK x BLOCK`` score tile stays on chip, so the softmax is
exact in one pass and the backward pass needs no atomics: every token belongs to exactly one window.

Grids are always handled as rank 3 (missing leading axes have length 1 and window 1). Every size
that changes with batch or grid (lengths, window counts) is a runtime argument excluded from
Triton's integer specialisation, so a new batch or grid size reuses the compiled kernel.
"""

import triton
import triton.language as tl

LOG2E = 1.4426950408889634

# Runtime sizes that must not trigger a recompilation when they change.
_RUNTIME_SIZES = [
    "batch", "L0", "L1", "L2", "NW0", "NW1", "NW2", "OFF0", "OFF1", "OFF2",
    "DL0", "DL1", "DL2", "num_windows", "windows_per_program",
]


@triton.jit
def _axis_window(t, L, DL, NW, OFF, W: tl.constexpr):
    """Window ``t`` of one axis (``t = group * NW + w``): its dilation group, the group coordinate
    of its first (possibly outside the grid) slot, and the in-grid slot range ``[lo, hi)``."""
    group = t // NW
    w = t - group * NW
    group_len = (L - group + DL - 1) // DL
    raw = w * W - OFF
    lo = tl.maximum(raw, 0)
    hi = tl.minimum(raw + W, group_len)
    return group, raw, lo, hi


@triton.jit
def _window_tile(win, L0, L1, L2, NW0, NW1, NW2, OFF0, OFF1, OFF2, DL0, DL1, DL2,
                 W0: tl.constexpr, W1: tl.constexpr, W2: tl.constexpr, BLOCK: tl.constexpr):
    """Batch index, per-axis grid positions, in-window coordinates and validity of the ``BLOCK``
    slots of window ``win`` (row-major over batch, then axes 0, 1, 2; each axis over its
    dilation groups, then its windows)."""
    T2 = DL2 * NW2
    T1 = DL1 * NW1
    T0 = DL0 * NW0
    t2 = win % T2
    rest = win // T2
    t1 = rest % T1
    rest = rest // T1
    t0 = rest % T0
    b = rest // T0
    g0, raw0, lo0, hi0 = _axis_window(t0, L0, DL0, NW0, OFF0, W0)
    g1, raw1, lo1, hi1 = _axis_window(t1, L1, DL1, NW1, OFF1, W1)
    g2, raw2, lo2, hi2 = _axis_window(t2, L2, DL2, NW2, OFF2, W2)
    slot = tl.arange(0, BLOCK)
    c0 = slot // (W1 * W2)
    c1 = (slot // W2) % W1
    c2 = slot % W2
    y0 = raw0 + c0
    y1 = raw1 + c1
    y2 = raw2 + c2
    valid = (slot < W0 * W1 * W2) & (y0 >= lo0) & (y0 < hi0) & (y1 >= lo1) & (y1 < hi1) & (y2 >= lo2) & (y2 < hi2)
    return b, g0 + DL0 * y0, g1 + DL1 * y1, g2 + DL2 * y2, c0, c1, c2, valid


@triton.jit
def _pair_mask(valid, c0, c1, c2, CAUSAL0: tl.constexpr, CAUSAL1: tl.constexpr, CAUSAL2: tl.constexpr):
    """[query, key] pairs that attend: both slots real, and key <= query on causal axes."""
    keep = valid[:, None] & valid[None, :]
    if CAUSAL0:
        keep = keep & (c0[None, :] <= c0[:, None])
    if CAUSAL1:
        keep = keep & (c1[None, :] <= c1[:, None])
    if CAUSAL2:
        keep = keep & (c2[None, :] <= c2[:, None])
    return keep


@triton.jit
def _offsets(b, p0, p1, p2, sb, s0, s1, s2):
    return b.to(tl.int64) * sb + p0 * s0 + p1 * s1 + p2 * s2


@triton.jit
def _load_rows(ptr, rows, row_ok, stride_d, D, BLOCK_D: tl.constexpr):
    cols = tl.arange(0, BLOCK_D)
    return tl.load(ptr + rows[:, None] + cols[None, :] * stride_d,
                   mask=row_ok[:, None] & (cols[None, :] < D), other=0.0)


@triton.jit
def _store_rows(ptr, rows, row_ok, stride_d, D, value, BLOCK_D: tl.constexpr):
    cols = tl.arange(0, BLOCK_D)
    tl.store(ptr + rows[:, None] + cols[None, :] * stride_d, value.to(ptr.dtype.element_ty),
             mask=row_ok[:, None] & (cols[None, :] < D))


@triton.jit
def _dot(a, b, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """a @ b with float32 accumulation. UPCAST multiplies (exactly) in float32: Triton's CPU
    interpreter mis-multiplies bfloat16 operands."""
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    return tl.dot(a, b, input_precision=PRECISION)


@triton.jit
def _scores(q, k, bias_ptr, h, keep, scale, softcap, BLOCK: tl.constexpr, HAS_BIAS: tl.constexpr,
            HAS_SOFTCAP: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """Scores before masking (section 5): scale * q k^T + rpb, then softcap. Returns the capped
    scores and, for the softcap derivative, the capped scores / softcap (tanh)."""
    s = _dot(q, tl.trans(k), PRECISION, UPCAST) * scale
    if HAS_BIAS:
        slots = tl.arange(0, BLOCK)
        s += tl.load(bias_ptr + h * BLOCK * BLOCK + slots[:, None] * BLOCK + slots[None, :])
    tanh = s
    if HAS_SOFTCAP:
        # tanh from exp: portable to the interpreter, exact at both saturations.
        tanh = 1.0 - 2.0 / (tl.exp(2.0 * s / softcap) + 1.0)
        s = softcap * tanh
    s = tl.where(keep, s, float("-inf"))
    return s, tanh


@triton.jit(do_not_specialize=_RUNTIME_SIZES)
def window_forward_kernel(
    Q, K, V, O, LSE, BIAS,
    sqb, sq0, sq1, sq2, sqh, sqd,
    skb, sk0, sk1, sk2, skh, skd,
    svb, sv0, sv1, sv2, svh, svd,
    sob, so0, so1, so2, soh, sod,
    slb, sl0, sl1, sl2, slh,
    batch, L0, L1, L2, NW0, NW1, NW2, OFF0, OFF1, OFF2, DL0, DL1, DL2,
    num_windows, windows_per_program,
    H, G, D, DV, scale, softcap,
    W0: tl.constexpr, W1: tl.constexpr, W2: tl.constexpr,
    CAUSAL0: tl.constexpr, CAUSAL1: tl.constexpr, CAUSAL2: tl.constexpr,
    BLOCK: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_SOFTCAP: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):
    # Heads vary fastest across programs so the heads of one window run side by side and share
    # the window's cache lines.
    pid = tl.program_id(0)
    h = pid % H
    first = (pid // H) * windows_per_program
    kv_h = h // G
    # A while loop, not range(): the interpreter (NumPy >= 2.4) cannot index with a runtime int.
    win = first
    while win < first + windows_per_program:
        b, p0, p1, p2, c0, c1, c2, valid = _window_tile(
            win, L0, L1, L2, NW0, NW1, NW2, OFF0, OFF1, OFF2, DL0, DL1, DL2, W0, W1, W2, BLOCK)
        valid = valid & (win < num_windows)  # the last program's surplus steps
        q = _load_rows(Q + h * sqh, _offsets(b, p0, p1, p2, sqb, sq0, sq1, sq2), valid, sqd, D, BLOCK_D)
        k = _load_rows(K + kv_h * skh, _offsets(b, p0, p1, p2, skb, sk0, sk1, sk2), valid, skd, D, BLOCK_D)
        v = _load_rows(V + kv_h * svh, _offsets(b, p0, p1, p2, svb, sv0, sv1, sv2), valid, svd, DV, BLOCK_DV)
        keep = _pair_mask(valid, c0, c1, c2, CAUSAL0, CAUSAL1, CAUSAL2)
        s, _ = _scores(q, k, BIAS, h, keep, scale, softcap, BLOCK, HAS_BIAS, HAS_SOFTCAP, PRECISION, UPCAST)
        # Padding rows have no key: a zero max keeps their exp at 0 instead of NaN.
        m = tl.max(s, axis=1)
        m = tl.where(m == float("-inf"), 0.0, m)
        p = tl.exp2((s - m[:, None]) * LOG2E)
        total = tl.sum(p, axis=1)
        total = tl.where(total == 0.0, 1.0, total)
        out = _dot(p.to(v.dtype), v, PRECISION, UPCAST) / total[:, None]
        _store_rows(O + h * soh, _offsets(b, p0, p1, p2, sob, so0, so1, so2), valid, sod, DV, out, BLOCK_DV)
        lse = m + tl.log(total)
        tl.store(LSE + h * slh + _offsets(b, p0, p1, p2, slb, sl0, sl1, sl2), lse, mask=valid)
        win += 1


@triton.jit(do_not_specialize=_RUNTIME_SIZES)
def window_backward_kernel(
    Q, K, V, O, LSE, DO, GLSE, BIAS, DQ, DK, DV_OUT, DBIAS,
    sqb, sq0, sq1, sq2, sqh, sqd,
    skb, sk0, sk1, sk2, skh, skd,
    svb, sv0, sv1, sv2, svh, svd,
    sob, so0, so1, so2, soh, sod,
    slb, sl0, sl1, sl2, slh,
    sdob, sdo0, sdo1, sdo2, sdoh, sdod,
    sdqb, sdq0, sdq1, sdq2, sdqh, sdqd,
    sdkb, sdk0, sdk1, sdk2, sdkh, sdkd,
    sdvb, sdv0, sdv1, sdv2, sdvh, sdvd,
    batch, L0, L1, L2, NW0, NW1, NW2, OFF0, OFF1, OFF2, DL0, DL1, DL2,
    num_windows, windows_per_program,
    H, G, D, DV, scale, softcap,
    W0: tl.constexpr, W1: tl.constexpr, W2: tl.constexpr,
    CAUSAL0: tl.constexpr, CAUSAL1: tl.constexpr, CAUSAL2: tl.constexpr,
    BLOCK: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    HAS_BIAS: tl.constexpr, BIAS_GRAD: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_GLSE: tl.constexpr,
    PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):
    """dQ, dK, dV of query head ``h`` for ``windows_per_program`` windows. dK/dV are written per
    query head (the caller sums the query heads of a GQA group); the rpb gradient is this
    program's dS summed over its windows, one ``BLOCK x BLOCK`` partial per program, reduced by
    the caller: deterministic, no atomics."""
    pid = tl.program_id(0)
    h = pid % H
    first = (pid // H) * windows_per_program
    kv_h = h // G
    dbias = tl.zeros((BLOCK, BLOCK), dtype=tl.float32)
    # A while loop, not range(): the interpreter (NumPy >= 2.4) cannot index with a runtime int.
    win = first
    while win < first + windows_per_program:
        b, p0, p1, p2, c0, c1, c2, valid = _window_tile(
            win, L0, L1, L2, NW0, NW1, NW2, OFF0, OFF1, OFF2, DL0, DL1, DL2, W0, W1, W2, BLOCK)
        valid = valid & (win < num_windows)  # the last program's surplus steps
        q = _load_rows(Q + h * sqh, _offsets(b, p0, p1, p2, sqb, sq0, sq1, sq2), valid, sqd, D, BLOCK_D)
        k = _load_rows(K + kv_h * skh, _offsets(b, p0, p1, p2, skb, sk0, sk1, sk2), valid, skd, D, BLOCK_D)
        v = _load_rows(V + kv_h * svh, _offsets(b, p0, p1, p2, svb, sv0, sv1, sv2), valid, svd, DV, BLOCK_DV)
        o = _load_rows(O + h * soh, _offsets(b, p0, p1, p2, sob, so0, so1, so2), valid, sod, DV, BLOCK_DV)
        do = _load_rows(DO + h * sdoh, _offsets(b, p0, p1, p2, sdob, sdo0, sdo1, sdo2), valid, sdod, DV, BLOCK_DV)
        lse_rows = h * slh + _offsets(b, p0, p1, p2, slb, sl0, sl1, sl2)
        lse = tl.load(LSE + lse_rows, mask=valid, other=0.0)
        delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)
        if HAS_GLSE:
            delta -= tl.load(GLSE + lse_rows, mask=valid, other=0.0)

        keep = _pair_mask(valid, c0, c1, c2, CAUSAL0, CAUSAL1, CAUSAL2)
        s, tanh = _scores(q, k, BIAS, h, keep, scale, softcap, BLOCK, HAS_BIAS, HAS_SOFTCAP, PRECISION, UPCAST)
        p = tl.where(keep, tl.exp2((s - lse[:, None]) * LOG2E), 0.0)
        dv = _dot(tl.trans(p.to(do.dtype)), do, PRECISION, UPCAST)
        dp = _dot(do, tl.trans(v), PRECISION, UPCAST)
        ds = p * (dp - delta[:, None])
        if HAS_SOFTCAP:
            ds = ds * (1.0 - tanh * tanh)
        if BIAS_GRAD:
            dbias += ds
        ds_in = ds.to(q.dtype)
        dq = _dot(ds_in, k, PRECISION, UPCAST) * scale
        dk = _dot(tl.trans(ds_in), q, PRECISION, UPCAST) * scale
        _store_rows(DQ + h * sdqh, _offsets(b, p0, p1, p2, sdqb, sdq0, sdq1, sdq2), valid, sdqd, D, dq, BLOCK_D)
        _store_rows(DK + h * sdkh, _offsets(b, p0, p1, p2, sdkb, sdk0, sdk1, sdk2), valid, sdkd, D, dk, BLOCK_D)
        _store_rows(DV_OUT + h * sdvh, _offsets(b, p0, p1, p2, sdvb, sdv0, sdv1, sdv2), valid, sdvd, DV, dv,
                    BLOCK_DV)
        win += 1
    if BIAS_GRAD:
        slots = tl.arange(0, BLOCK)
        tl.store(DBIAS + pid.to(tl.int64) * BLOCK * BLOCK + slots[:, None] * BLOCK + slots[None, :], dbias)
