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

LOG2E = tl.constexpr(1.4426950408889634)

# Runtime sizes that must not trigger a recompilation when they change.
# Runtime sizes, and the batch/spatial strides that change with them, must not trigger a
# recompilation: they are excluded from Triton's specialisation. Row alignment, which that
# specialisation would have proven, comes from the ALIGN constexpr instead (a property of the
# channel layout, not of the grid): see _row_offsets.
_RUNTIME_SIZES = [
    "batch", "L0", "L1", "L2", "NW0", "NW1", "NW2", "OFF0", "OFF1", "OFF2",
    "DL0", "DL1", "DL2", "num_windows", "windows_per_program",
] + [f"s{t}{axis}" for t in ("q", "k", "v", "o", "do", "dq", "dk", "dv") for axis in ("b", "0", "1", "2")] + [
    "slb", "sl0", "sl1", "sl2", "slh",
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
def _window_slots(win, first_slot, L0, L1, L2, NW0, NW1, NW2, OFF0, OFF1, OFF2, DL0, DL1, DL2,
                  W0: tl.constexpr, W1: tl.constexpr, W2: tl.constexpr, SLOTS: tl.constexpr):
    """Batch index, per-axis grid positions, in-window coordinates and validity of the slots
    ``first_slot + [0, SLOTS)`` of window ``win`` (windows row-major over batch, then axes 0, 1,
    2; each axis over its dilation groups, then its windows)."""
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
    slot = first_slot + tl.arange(0, SLOTS)
    c0 = slot // (W1 * W2)
    c1 = (slot // W2) % W1
    c2 = slot % W2
    y0 = raw0 + c0
    y1 = raw1 + c1
    y2 = raw2 + c2
    valid = (slot < W0 * W1 * W2) & (y0 >= lo0) & (y0 < hi0) & (y1 >= lo1) & (y1 < hi1) & (y2 >= lo2) & (y2 < hi2)
    return b, g0 + DL0 * y0, g1 + DL1 * y1, g2 + DL2 * y2, c0, c1, c2, valid


@triton.jit
def _pair_mask(q_ok, q0, q1, q2, k_ok, k0, k1, k2,
               CAUSAL0: tl.constexpr, CAUSAL1: tl.constexpr, CAUSAL2: tl.constexpr):
    """[query, key] pairs that attend: both slots real, and key <= query on causal axes."""
    keep = q_ok[:, None] & k_ok[None, :]
    if CAUSAL0:
        keep = keep & (k0[None, :] <= q0[:, None])
    if CAUSAL1:
        keep = keep & (k1[None, :] <= q1[:, None])
    if CAUSAL2:
        keep = keep & (k2[None, :] <= q2[:, None])
    return keep


@triton.jit
def _offsets(b, p0, p1, p2, sb, s0, s1, s2):
    return b.to(tl.int64) * sb + p0 * s0 + p1 * s1 + p2 * s2


@triton.jit
def _row_offsets(b, p0, p1, p2, sb, s0, s1, s2, ALIGN: tl.constexpr):
    """Element offsets of token rows. The batch/spatial strides arrive divided by ALIGN: the
    product by a constant proves the rows ALIGN-aligned, so loads vectorise (tl.multiple_of on the
    sum was not honoured here)."""
    return _offsets(b, p0, p1, p2, sb, s0, s1, s2) * ALIGN


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
def _scores(q, k, bias_ptr, h, first_q, keep, scale, softcap, BLOCK_M: tl.constexpr, BLOCK: tl.constexpr,
            HAS_BIAS: tl.constexpr, HAS_SOFTCAP: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """Masked scores of query slots ``first_q + [0, BLOCK_M)`` against the window's ``BLOCK`` key
    slots (section 5): scale * q k^T + rpb, then softcap. Also returns tanh (the capped score /
    softcap) for the softcap derivative."""
    s = _dot(q, tl.trans(k), PRECISION, UPCAST) * scale
    if HAS_BIAS:
        rows = first_q + tl.arange(0, BLOCK_M)
        cols = tl.arange(0, BLOCK)
        s += tl.load(bias_ptr + h * BLOCK * BLOCK + rows[:, None] * BLOCK + cols[None, :])
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
    BLOCK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_SOFTCAP: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
    ALIGN: tl.constexpr,
):
    """Output and LSE of query head ``h`` for ``BLOCK_M`` query slots of ``windows_per_program``
    windows, against all ``BLOCK`` key slots of each window (one pass: exact softmax)."""
    # Heads vary fastest across programs so the heads of one window run side by side and share
    # the window's cache lines; then the query chunk (windows over 128 tokens), then windows.
    pid = tl.program_id(0)
    h = pid % H
    rest = pid // H
    first_q = (rest % (BLOCK // BLOCK_M)) * BLOCK_M
    kv_h = h // G
    # A while loop, not range(): the interpreter (NumPy >= 2.4) cannot index with a runtime int.
    win = (rest // (BLOCK // BLOCK_M)) * windows_per_program
    last = win + windows_per_program
    while win < last:
        b, p0, p1, p2, k0, k1, k2, k_ok = _window_slots(
            win, 0, L0, L1, L2, NW0, NW1, NW2, OFF0, OFF1, OFF2, DL0, DL1, DL2, W0, W1, W2, BLOCK)
        _, r0, r1, r2, q0, q1, q2, q_ok = _window_slots(
            win, first_q, L0, L1, L2, NW0, NW1, NW2, OFF0, OFF1, OFF2, DL0, DL1, DL2, W0, W1, W2, BLOCK_M)
        k_ok = k_ok & (win < num_windows)  # the last program's surplus steps
        q_ok = q_ok & (win < num_windows)
        q = _load_rows(Q + h * sqh, _row_offsets(b, r0, r1, r2, sqb, sq0, sq1, sq2, ALIGN), q_ok, sqd, D, BLOCK_D)
        k = _load_rows(K + kv_h * skh, _row_offsets(b, p0, p1, p2, skb, sk0, sk1, sk2, ALIGN), k_ok, skd, D, BLOCK_D)
        v = _load_rows(V + kv_h * svh, _row_offsets(b, p0, p1, p2, svb, sv0, sv1, sv2, ALIGN), k_ok, svd, DV, BLOCK_DV)
        keep = _pair_mask(q_ok, q0, q1, q2, k_ok, k0, k1, k2, CAUSAL0, CAUSAL1, CAUSAL2)
        s, _ = _scores(q, k, BIAS, h, first_q, keep, scale, softcap, BLOCK_M, BLOCK, HAS_BIAS, HAS_SOFTCAP,
                       PRECISION, UPCAST)
        # Padding rows have no key: a zero max keeps their exp at 0 instead of NaN.
        m = tl.max(s, axis=1)
        m = tl.where(m == float("-inf"), 0.0, m)
        p = tl.exp2((s - m[:, None]) * LOG2E)
        total = tl.sum(p, axis=1)
        total = tl.where(total == 0.0, 1.0, total)
        out = _dot(p.to(v.dtype), v, PRECISION, UPCAST) / total[:, None]
        _store_rows(O + h * soh, _row_offsets(b, r0, r1, r2, sob, so0, so1, so2, ALIGN), q_ok, sod, DV, out, BLOCK_DV)
        lse = m + tl.log(total)
        tl.store(LSE + h * slh + _offsets(b, r0, r1, r2, slb, sl0, sl1, sl2), lse, mask=q_ok)
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
    BLOCK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    HAS_BIAS: tl.constexpr, BIAS_GRAD: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_GLSE: tl.constexpr,
    PRECISION: tl.constexpr, UPCAST: tl.constexpr, ALIGN: tl.constexpr,
):
    """dQ, dK, dV of query head ``h`` for ``windows_per_program`` windows, walking each window's
    queries in ``BLOCK_M`` chunks against all its keys. dK/dV are written per query head (the
    caller sums the query heads of a GQA group). The rpb gradient is this program's dS summed over
    its windows, one ``BLOCK x BLOCK`` partial per program that the caller reduces: deterministic,
    no atomics. With one chunk the partial accumulates in registers; with several, in the
    program's own (zeroed) slice of DBIAS."""
    NUM_M: tl.constexpr = BLOCK // BLOCK_M
    pid = tl.program_id(0)
    h = pid % H
    kv_h = h // G
    win = (pid // H) * windows_per_program
    last = win + windows_per_program
    cols = tl.arange(0, BLOCK)
    dbias_ptr = DBIAS + pid.to(tl.int64) * BLOCK * BLOCK
    dbias = tl.zeros((BLOCK_M, BLOCK), dtype=tl.float32)
    while win < last:
        b, p0, p1, p2, k0, k1, k2, k_ok = _window_slots(
            win, 0, L0, L1, L2, NW0, NW1, NW2, OFF0, OFF1, OFF2, DL0, DL1, DL2, W0, W1, W2, BLOCK)
        k_ok = k_ok & (win < num_windows)  # the last program's surplus steps
        k = _load_rows(K + kv_h * skh, _row_offsets(b, p0, p1, p2, skb, sk0, sk1, sk2, ALIGN), k_ok, skd, D, BLOCK_D)
        v = _load_rows(V + kv_h * svh, _row_offsets(b, p0, p1, p2, svb, sv0, sv1, sv2, ALIGN), k_ok, svd, DV, BLOCK_DV)
        dk = tl.zeros((BLOCK, BLOCK_D), dtype=tl.float32)
        dv = tl.zeros((BLOCK, BLOCK_DV), dtype=tl.float32)
        for chunk in tl.static_range(NUM_M):
            first_q = chunk * BLOCK_M
            _, r0, r1, r2, q0, q1, q2, q_ok = _window_slots(
                win, first_q, L0, L1, L2, NW0, NW1, NW2, OFF0, OFF1, OFF2, DL0, DL1, DL2, W0, W1, W2, BLOCK_M)
            q_ok = q_ok & (win < num_windows)
            q = _load_rows(Q + h * sqh, _row_offsets(b, r0, r1, r2, sqb, sq0, sq1, sq2, ALIGN), q_ok, sqd, D, BLOCK_D)
            o = _load_rows(O + h * soh, _row_offsets(b, r0, r1, r2, sob, so0, so1, so2, ALIGN), q_ok, sod, DV, BLOCK_DV)
            do = _load_rows(DO + h * sdoh, _row_offsets(b, r0, r1, r2, sdob, sdo0, sdo1, sdo2, ALIGN), q_ok, sdod, DV,
                            BLOCK_DV)
            lse_rows = h * slh + _offsets(b, r0, r1, r2, slb, sl0, sl1, sl2)
            lse = tl.load(LSE + lse_rows, mask=q_ok, other=0.0)
            delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)
            if HAS_GLSE:
                delta -= tl.load(GLSE + lse_rows, mask=q_ok, other=0.0)

            keep = _pair_mask(q_ok, q0, q1, q2, k_ok, k0, k1, k2, CAUSAL0, CAUSAL1, CAUSAL2)
            s, tanh = _scores(q, k, BIAS, h, first_q, keep, scale, softcap, BLOCK_M, BLOCK, HAS_BIAS,
                              HAS_SOFTCAP, PRECISION, UPCAST)
            p = tl.where(keep, tl.exp2((s - lse[:, None]) * LOG2E), 0.0)
            dv += _dot(tl.trans(p.to(do.dtype)), do, PRECISION, UPCAST)
            dp = _dot(do, tl.trans(v), PRECISION, UPCAST)
            ds = p * (dp - delta[:, None])
            if HAS_SOFTCAP:
                ds = ds * (1.0 - tanh * tanh)
            if BIAS_GRAD:
                if NUM_M == 1:
                    dbias += ds
                else:
                    tile = dbias_ptr + (first_q + tl.arange(0, BLOCK_M))[:, None] * BLOCK + cols[None, :]
                    tl.store(tile, tl.load(tile) + ds)
                    tl.debug_barrier()  # the next window's load may come from another thread
            ds_in = ds.to(q.dtype)
            dq = _dot(ds_in, k, PRECISION, UPCAST) * scale
            dk += _dot(tl.trans(ds_in), q, PRECISION, UPCAST) * scale
            _store_rows(DQ + h * sdqh, _row_offsets(b, r0, r1, r2, sdqb, sdq0, sdq1, sdq2, ALIGN), q_ok, sdqd, D, dq, BLOCK_D)
        _store_rows(DK + h * sdkh, _row_offsets(b, p0, p1, p2, sdkb, sdk0, sdk1, sdk2, ALIGN), k_ok, sdkd, D, dk, BLOCK_D)
        _store_rows(DV_OUT + h * sdvh, _row_offsets(b, p0, p1, p2, sdvb, sdv0, sdv1, sdv2, ALIGN), k_ok, sdvd, DV, dv,
                    BLOCK_DV)
        win += 1
    if BIAS_GRAD:
        if NUM_M == 1:
            tl.store(dbias_ptr + tl.arange(0, BLOCK_M)[:, None] * BLOCK + cols[None, :], dbias)
