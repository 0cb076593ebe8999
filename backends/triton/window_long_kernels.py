"""Triton kernels for long windows (pattern "window", 129-256 padded tokens: Swin V2 / Swin-B 384
12x12 = 144 tokens, 16x16 = 256, Video Swin 4x6x6 = 144, 2x10x10 = 200).

A whole 256 x 256 score tile does not fit on chip, and padding the window volume to a power of two
wastes most of the work (144 tokens in 256 slots: 3.2x the pairs). Instead the window volume,
rounded up to a multiple of 16 (the smallest tile ``tl.dot`` takes), is cut into up to four
power-of-two *parts* of at most 64 slots, largest first (144 -> 64 + 64 + 16, 200 -> 208 ->
64 + 64 + 64 + 16, 256 -> 4 x 64; where that would take five parts, four full ones: 225 -> 4 x 64;
window_long_launch.parts): about 1.0-1.1x the useful pairs. Part sizes are constexprs
``P0..P3`` (0 = absent); part ``j`` starts at slot ``P0 + ... + P(j-1)``.

* Forward: one program per (query head, query part, run of consecutive windows). It walks its
  windows in a software-pipelined loop and, per window, its key parts (unrolled) with an online
  (flash) softmax. The query part is a runtime index: one compiled kernel and one launch serve every
  part size, each size a branch with its own tile shapes (a launch per part size would compile and
  launch up to four kernels per call; the registers a branch needs are those of its own tiles).
* Backward, deterministic and without atomics (FlashAttention-2 style, two kernels):
  - ``window_long_dq_kernel``, one program per (head, query part, run of windows): per key part, a
    pipelined loop over the windows computes dS and dQ += dS K. The key parts are the OUTER loop so
    that the rpb gradient of one (query part, key part) pair, dS summed over the program's windows,
    accumulates in registers (one part x one part); dQ of the window then crosses key parts through a
    float32 scratch that the program alone reads and writes. The first key part also computes
    delta = rowsum(O * dO) - grad_lse once per query row, for the second kernel.
  - ``window_long_dkdv_kernel``, one program per (head, key part, run of windows): per window, the
    query parts (unrolled) accumulate dK and dV in registers. GQA: written per query head, summed by
    the host.

Window enumeration, in-place strided loads, masks, scores and the rank-3 / ALIGN /
no-specialisation scheme are window_kernels' (see its docstring): a new batch or grid size reuses
the compiled kernels.
"""

import triton
import triton.language as tl

from .window_kernels import (
    LN2, LOG2E, _RUNTIME_SIZES, _dilated, _dot, _first_window, _keep, _load_rows, _next_window,
    _on_grid, _relative_offsets, _scores, _slot_coords, _store_rows, _window_base,
    _window_first_slots,
)

# The scalar arguments the long kernels add to window_kernels' runtime sizes: strides of the dQ
# accumulator scratch (they follow the grid size too), and ``zero`` (see ``_salt``), which must stay
# opaque to the compiler.
LONG_RUNTIME_SIZES = _RUNTIME_SIZES + [f"sa{axis}" for axis in ("b", "0", "1", "2", "h")] + ["zero"]


@triton.jit
def _part_slots(FIRST: tl.constexpr, SIZE: tl.constexpr, W0: tl.constexpr, W1: tl.constexpr, W2: tl.constexpr,
                DL0, DL1, DL2, DILATED0: tl.constexpr, DILATED1: tl.constexpr, DILATED2: tl.constexpr):
    """In-window coordinates of a part's slots, whether each is a window slot, and the coordinates
    times dilation (grid steps from the window's first slot). Window-independent."""
    c0, c1, c2, is_slot = _slot_coords(FIRST, SIZE, W0, W1, W2)
    d0, d1, d2 = _dilated(c0, c1, c2, DL0, DL1, DL2, DILATED0, DILATED1, DILATED2)
    return c0, c1, c2, is_slot, d0, d1, d2


@triton.constexpr_function
def _part_first(part, P0, P1, P2, P3):
    """First slot of part ``part`` (at compile time): the sizes of the parts before it."""
    return sum((P0, P1, P2, P3)[:part])


@triton.constexpr_function
def _part_size(part, P0, P1, P2, P3):
    """Slots of part ``part`` (at compile time); 0 for an absent part and past the fourth."""
    return (P0, P1, P2, P3, 0)[part]


@triton.jit
def _bias_slice(BIAS, h, salt, QFIRST: tl.constexpr, QSIZE: tl.constexpr, KFIRST: tl.constexpr,
                KSIZE: tl.constexpr, VP: tl.constexpr):
    """Pointers of the (query part, key part) block of head ``h``'s dense ``[VP, VP]`` bias tile.
    ``salt`` is 0, but not to the compiler: see ``_salt``."""
    rows = h * (VP * VP) + (QFIRST + tl.arange(0, QSIZE)) * VP + salt
    cols = KFIRST + tl.arange(0, KSIZE)
    return BIAS + rows[:, None] + cols[None, :]


@triton.jit
def _salt(i, zero):
    """0 (``zero`` is a runtime 0) that depends on the loop index ``i``. Window-invariant tile
    offsets (of the bias block, of a part's rows) would otherwise be hoisted out of the window loop
    and held in registers, one per element: for 128 x 128 bias blocks and several parts that alone
    exceeded the register file (255 registers and spills on sm_90). Added to an offset vector before
    it is broadcast to a tile, it makes the compiler recompute the tile per window (a few integer
    adds) instead."""
    return i * zero


@triton.jit
def _online_softmax_step(q, Kh, Vh, k_base, v_base, bias_ptr, m, total, acc, qc0, qc1, qc2, p0, p1, p2,
                         sk0, sk1, sk2, sv0, sv1, sv2, L0, L1, L2, DL0, DL1, DL2, scale, softcap,
                         KFIRST: tl.constexpr, KSIZE: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
                         W0: tl.constexpr, W1: tl.constexpr, W2: tl.constexpr, RANK: tl.constexpr,
                         DILATED0: tl.constexpr, DILATED1: tl.constexpr, DILATED2: tl.constexpr,
                         CAUSAL0: tl.constexpr, CAUSAL1: tl.constexpr, CAUSAL2: tl.constexpr,
                         BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, HAS_BIAS: tl.constexpr,
                         HAS_SOFTCAP: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
                         ALIGN: tl.constexpr):
    """One key part of one window folded into the running row max ``m``, row sum ``total`` and
    unnormalised output ``acc`` (log2 units). ``k_base``/``v_base``: the window's first slot."""
    kc0, kc1, kc2, k_slot, kd0, kd1, kd2 = _part_slots(KFIRST, KSIZE, W0, W1, W2, DL0, DL1, DL2,
                                                       DILATED0, DILATED1, DILATED2)
    k_ok = _on_grid(p0, p1, p2, kd0, kd1, kd2, k_slot, L0, L1, L2, RANK)
    k = _load_rows(Kh, k_base + _relative_offsets(kc0, kc1, kc2, DL0, DL1, DL2, sk0, sk1, sk2), k_ok, D, BLOCK_D,
                   ALIGN)
    v = _load_rows(Vh, v_base + _relative_offsets(kc0, kc1, kc2, DL0, DL1, DL2, sv0, sv1, sv2), k_ok, DV, BLOCK_DV,
                   ALIGN)
    bias = 0.0
    if HAS_BIAS:
        bias = tl.load(bias_ptr)
    keep = _keep(k_ok, qc0, qc1, qc2, kc0, kc1, kc2, CAUSAL0, CAUSAL1, CAUSAL2)
    s, _ = _scores(q, k, bias, keep, scale, softcap, HAS_BIAS, HAS_SOFTCAP, PRECISION, UPCAST)
    m_new = tl.maximum(m, tl.max(s, axis=1))
    # A row may have seen no key yet (causal axes, partial windows: a whole key part can be masked
    # for it): a zero reference keeps exp2 away from (-inf) - (-inf).
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m - m_ref)
    p = tl.exp2(s - m_ref[:, None])
    total = total * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, PRECISION, UPCAST)
    return m_new, total, acc


@triton.jit
def _forward_query_part(
    Qh, Kh, Vh, Oh, Lh, BIAS, h, first_win, count, zero,
    sqb, sq0, sq1, sq2, skb, sk0, sk1, sk2, svb, sv0, sv1, sv2, sob, so0, so1, so2, slb, sl0, sl1, sl2,
    L0, L1, L2, NW0, NW1, NW2, OFF0, OFF1, OFF2, DL0, DL1, DL2, scale, softcap,
    QFIRST: tl.constexpr, QSIZE: tl.constexpr,
    P0: tl.constexpr, P1: tl.constexpr, P2: tl.constexpr, P3: tl.constexpr,
    D: tl.constexpr, DV: tl.constexpr, W0: tl.constexpr, W1: tl.constexpr, W2: tl.constexpr, RANK: tl.constexpr,
    DILATED0: tl.constexpr, DILATED1: tl.constexpr, DILATED2: tl.constexpr,
    CAUSAL0: tl.constexpr, CAUSAL1: tl.constexpr, CAUSAL2: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
    PRECISION: tl.constexpr, UPCAST: tl.constexpr, ALIGN: tl.constexpr, NUM_STAGES: tl.constexpr,
):
    """Output and LSE of one query part for ``count`` windows from ``first_win``."""
    VP: tl.constexpr = P0 + P1 + P2 + P3
    qc0, qc1, qc2, q_slot, qd0, qd1, qd2 = _part_slots(QFIRST, QSIZE, W0, W1, W2, DL0, DL1, DL2,
                                                       DILATED0, DILATED1, DILATED2)
    q_rows = _relative_offsets(qc0, qc1, qc2, DL0, DL1, DL2, sq0, sq1, sq2)
    o_rows = _relative_offsets(qc0, qc1, qc2, DL0, DL1, DL2, so0, so1, so2)
    l_rows = _relative_offsets(qc0, qc1, qc2, DL0, DL1, DL2, sl0, sl1, sl2)
    b, g0, w0, g1, w1, g2, w2 = _first_window(first_win, NW0, NW1, NW2, DL0, DL1, DL2,
                                              RANK, DILATED0, DILATED1, DILATED2)
    for i in tl.range(0, count, num_stages=NUM_STAGES):
        p0, p1, p2 = _window_first_slots(g0, w0, g1, w1, g2, w2, DL0, DL1, DL2, OFF0, OFF1, OFF2, W0, W1, W2,
                                         DILATED0, DILATED1, DILATED2)
        q_ok = _on_grid(p0, p1, p2, qd0, qd1, qd2, q_slot, L0, L1, L2, RANK)
        q = _load_rows(Qh, _window_base(b, p0, p1, p2, sqb, sq0, sq1, sq2) + q_rows, q_ok, D, BLOCK_D, ALIGN)
        k_base = _window_base(b, p0, p1, p2, skb, sk0, sk1, sk2)
        v_base = _window_base(b, p0, p1, p2, svb, sv0, sv1, sv2)
        salt = _salt(i, zero)
        m = tl.full((QSIZE,), float("-inf"), tl.float32)
        total = tl.zeros((QSIZE,), tl.float32)
        acc = tl.zeros((QSIZE, BLOCK_DV), tl.float32)
        for part in tl.static_range(4):
            if _part_size(part, P0, P1, P2, P3) > 0:
                m, total, acc = _online_softmax_step(
                    q, Kh, Vh, k_base, v_base,
                    _bias_slice(BIAS, h, salt, QFIRST, QSIZE, _part_first(part, P0, P1, P2, P3),
                                _part_size(part, P0, P1, P2, P3), VP),
                    m, total, acc, qc0, qc1, qc2, p0, p1, p2, sk0, sk1, sk2, sv0, sv1, sv2, L0, L1, L2, DL0, DL1, DL2,
                    scale, softcap, _part_first(part, P0, P1, P2, P3), _part_size(part, P0, P1, P2, P3), D, DV,
                    W0, W1, W2, RANK, DILATED0, DILATED1, DILATED2, CAUSAL0, CAUSAL1, CAUSAL2, BLOCK_D, BLOCK_DV,
                    HAS_BIAS, HAS_SOFTCAP, PRECISION, UPCAST, ALIGN)
        # Rows that are not stored (padding, out of the grid) may have total 0: no division by it.
        total = tl.where(total == 0.0, 1.0, total)
        _store_rows(Oh, _window_base(b, p0, p1, p2, sob, so0, so1, so2) + o_rows, q_ok, DV,
                    acc * (1.0 / total)[:, None], BLOCK_DV, ALIGN)
        m = tl.where(m == float("-inf"), 0.0, m)
        tl.store(Lh + _window_base(b, p0, p1, p2, slb, sl0, sl1, sl2) + l_rows, (m + tl.log2(total)) * LN2,
                 mask=q_ok)
        b, g0, w0, g1, w1, g2, w2 = _next_window(b, g0, w0, g1, w1, g2, w2, NW0, NW1, NW2, DL0, DL1, DL2,
                                                 RANK, DILATED0, DILATED1, DILATED2)


@triton.jit(do_not_specialize=LONG_RUNTIME_SIZES)
def window_long_forward_kernel(
    Q, K, V, O, LSE, BIAS,
    sqb, sq0, sq1, sq2, sqh,
    skb, sk0, sk1, sk2, skh,
    svb, sv0, sv1, sv2, svh,
    sob, so0, so1, so2, soh,
    slb, sl0, sl1, sl2, slh,
    batch, L0, L1, L2, NW0, NW1, NW2, OFF0, OFF1, OFF2, DL0, DL1, DL2,
    num_windows, windows_per_program,
    H, G, scale, softcap, zero,
    D: tl.constexpr, DV: tl.constexpr,
    W0: tl.constexpr, W1: tl.constexpr, W2: tl.constexpr, RANK: tl.constexpr,
    DILATED0: tl.constexpr, DILATED1: tl.constexpr, DILATED2: tl.constexpr,
    CAUSAL0: tl.constexpr, CAUSAL1: tl.constexpr, CAUSAL2: tl.constexpr,
    P0: tl.constexpr, P1: tl.constexpr, P2: tl.constexpr, P3: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_SOFTCAP: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
    ALIGN: tl.constexpr, NUM_STAGES: tl.constexpr,
):
    """Output and LSE of query head ``h``, query part ``part``, for ``windows_per_program``
    consecutive windows. Heads vary fastest across programs (the heads of a window share its cache
    lines), then parts (a window's parts share its keys), then windows."""
    NUM_PARTS: tl.constexpr = (P0 > 0) + (P1 > 0) + (P2 > 0) + (P3 > 0)
    pid = tl.program_id(0)
    h = pid % H
    rest = pid // H
    part = rest % NUM_PARTS
    first_win = (rest // NUM_PARTS) * windows_per_program
    count = tl.minimum(windows_per_program, num_windows - first_win)
    kv_h = h // G
    Qh = Q + h * sqh * ALIGN
    Kh = K + kv_h * skh * ALIGN
    Vh = V + kv_h * svh * ALIGN
    Oh = O + h * soh * ALIGN
    Lh = LSE + h * slh
    for q_part in tl.static_range(4):
        if _part_size(q_part, P0, P1, P2, P3) > 0:
            if part == q_part:
                _forward_query_part(
                    Qh, Kh, Vh, Oh, Lh, BIAS, h, first_win, count, zero, sqb, sq0, sq1, sq2, skb, sk0, sk1, sk2,
                    svb, sv0, sv1, sv2, sob, so0, so1, so2, slb, sl0, sl1, sl2, L0, L1, L2, NW0, NW1, NW2,
                    OFF0, OFF1, OFF2, DL0, DL1, DL2, scale, softcap,
                    _part_first(q_part, P0, P1, P2, P3), _part_size(q_part, P0, P1, P2, P3), P0, P1, P2, P3,
                    D, DV, W0, W1, W2, RANK, DILATED0, DILATED1, DILATED2, CAUSAL0, CAUSAL1, CAUSAL2,
                    BLOCK_D, BLOCK_DV, HAS_BIAS, HAS_SOFTCAP, PRECISION, UPCAST, ALIGN, NUM_STAGES)


@triton.jit
def _query_rows_state(Qw, DOw, Lw, Aw, q_rows, do_rows, l_rows, q_ok,
                      D: tl.constexpr, DV: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                      ALIGN: tl.constexpr):
    """A query part's q, dO, LSE (log2 units; +inf on rows that are not queries, whose
    probabilities then come out 0) and delta (read back from the dQ kernel's scratch)."""
    q = _load_rows(Qw, q_rows, q_ok, D, BLOCK_D, ALIGN)
    do = _load_rows(DOw, do_rows, q_ok, DV, BLOCK_DV, ALIGN)
    lse = tl.load(Lw + l_rows, mask=q_ok, other=float("inf")) * LOG2E
    delta = tl.load(Aw + l_rows, mask=q_ok, other=0.0)
    return q, do, lse, delta


@triton.jit
def _score_gradient(q, k, v, do, lse, delta, bias, keep, scale, softcap,
                    HAS_BIAS: tl.constexpr, HAS_SOFTCAP: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """Probabilities P and the score gradient dS of one (query part, key part) block: dS is the
    gradient of the pre-softcap score (that is also the rpb gradient; dQ/dK take it times scale)."""
    s, tanh = _scores(q, k, bias, keep, scale, softcap, HAS_BIAS, HAS_SOFTCAP, PRECISION, UPCAST)
    p = tl.exp2(s - lse[:, None])
    dp = _dot(do, tl.trans(v), PRECISION, UPCAST)
    ds = p * (dp - delta[:, None])
    if HAS_SOFTCAP:
        ds = ds * (1.0 - tanh * tanh)
    return p, ds


@triton.jit
def _dq_key_part(
    Qh, Kh, Vh, Oh, Lh, DOh, GLh, Ah, DQh, ACCh, BIAS, DBIASp, h, first_win, count, zero,
    sqb, sq0, sq1, sq2, skb, sk0, sk1, sk2, svb, sv0, sv1, sv2, sob, so0, so1, so2, slb, sl0, sl1, sl2,
    sdob, sdo0, sdo1, sdo2, sdqb, sdq0, sdq1, sdq2, sab, sa0, sa1, sa2,
    L0, L1, L2, NW0, NW1, NW2, OFF0, OFF1, OFF2, DL0, DL1, DL2, scale, softcap,
    QFIRST: tl.constexpr, QSIZE: tl.constexpr, KFIRST: tl.constexpr, KSIZE: tl.constexpr, VP: tl.constexpr,
    FIRST_KP: tl.constexpr, LAST_KP: tl.constexpr,
    D: tl.constexpr, DV: tl.constexpr, W0: tl.constexpr, W1: tl.constexpr, W2: tl.constexpr, RANK: tl.constexpr,
    DILATED0: tl.constexpr, DILATED1: tl.constexpr, DILATED2: tl.constexpr,
    CAUSAL0: tl.constexpr, CAUSAL1: tl.constexpr, CAUSAL2: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, HAS_BIAS: tl.constexpr, BIAS_GRAD: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr, HAS_GLSE: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
    ALIGN: tl.constexpr, NUM_STAGES: tl.constexpr,
):
    """dQ contributions of one key part to one query part over ``count`` windows; the rpb-gradient
    block (dS summed over the windows) in registers, stored once at the end. The first key part
    computes delta (stored for later key parts and the dK/dV kernel); dQ crosses key parts through
    the float32 scratch ``ACC`` (this program's own rows only: no other program touches them)."""
    qc0, qc1, qc2, q_slot, qd0, qd1, qd2 = _part_slots(QFIRST, QSIZE, W0, W1, W2, DL0, DL1, DL2,
                                                       DILATED0, DILATED1, DILATED2)
    kc0, kc1, kc2, k_slot, kd0, kd1, kd2 = _part_slots(KFIRST, KSIZE, W0, W1, W2, DL0, DL1, DL2,
                                                       DILATED0, DILATED1, DILATED2)
    q_rows = _relative_offsets(qc0, qc1, qc2, DL0, DL1, DL2, sq0, sq1, sq2)
    do_rows = _relative_offsets(qc0, qc1, qc2, DL0, DL1, DL2, sdo0, sdo1, sdo2)
    l_rows = _relative_offsets(qc0, qc1, qc2, DL0, DL1, DL2, sl0, sl1, sl2)
    dq_rows = _relative_offsets(qc0, qc1, qc2, DL0, DL1, DL2, sdq0, sdq1, sdq2)
    a_rows = _relative_offsets(qc0, qc1, qc2, DL0, DL1, DL2, sa0, sa1, sa2)
    k_rows = _relative_offsets(kc0, kc1, kc2, DL0, DL1, DL2, sk0, sk1, sk2)
    v_rows = _relative_offsets(kc0, kc1, kc2, DL0, DL1, DL2, sv0, sv1, sv2)
    dbias = tl.zeros((QSIZE, KSIZE), tl.float32)
    b, g0, w0, g1, w1, g2, w2 = _first_window(first_win, NW0, NW1, NW2, DL0, DL1, DL2,
                                              RANK, DILATED0, DILATED1, DILATED2)
    for i in tl.range(0, count, num_stages=NUM_STAGES):
        p0, p1, p2 = _window_first_slots(g0, w0, g1, w1, g2, w2, DL0, DL1, DL2, OFF0, OFF1, OFF2, W0, W1, W2,
                                         DILATED0, DILATED1, DILATED2)
        q_ok = _on_grid(p0, p1, p2, qd0, qd1, qd2, q_slot, L0, L1, L2, RANK)
        k_ok = _on_grid(p0, p1, p2, kd0, kd1, kd2, k_slot, L0, L1, L2, RANK)
        lse_at = _window_base(b, p0, p1, p2, slb, sl0, sl1, sl2) + l_rows
        q = _load_rows(Qh, _window_base(b, p0, p1, p2, sqb, sq0, sq1, sq2) + q_rows, q_ok, D, BLOCK_D, ALIGN)
        do = _load_rows(DOh, _window_base(b, p0, p1, p2, sdob, sdo0, sdo1, sdo2) + do_rows, q_ok, DV, BLOCK_DV,
                        ALIGN)
        lse = tl.load(Lh + lse_at, mask=q_ok, other=float("inf")) * LOG2E
        if FIRST_KP:
            o = _load_rows(Oh, _window_base(b, p0, p1, p2, sob, so0, so1, so2)
                           + _relative_offsets(qc0, qc1, qc2, DL0, DL1, DL2, so0, so1, so2), q_ok, DV, BLOCK_DV, ALIGN)
            delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)
            if HAS_GLSE:
                delta -= tl.load(GLh + lse_at, mask=q_ok, other=0.0)
            tl.store(Ah + lse_at, delta, mask=q_ok)
        else:
            delta = tl.load(Ah + lse_at, mask=q_ok, other=0.0)
        k = _load_rows(Kh, _window_base(b, p0, p1, p2, skb, sk0, sk1, sk2) + k_rows, k_ok, D, BLOCK_D, ALIGN)
        v = _load_rows(Vh, _window_base(b, p0, p1, p2, svb, sv0, sv1, sv2) + v_rows, k_ok, DV, BLOCK_DV, ALIGN)
        bias = 0.0
        if HAS_BIAS:
            bias = tl.load(_bias_slice(BIAS, h, _salt(i, zero), QFIRST, QSIZE, KFIRST, KSIZE, VP))
        keep = _keep(k_ok, qc0, qc1, qc2, kc0, kc1, kc2, CAUSAL0, CAUSAL1, CAUSAL2)
        _, ds = _score_gradient(q, k, v, do, lse, delta, bias, keep, scale, softcap,
                                HAS_BIAS, HAS_SOFTCAP, PRECISION, UPCAST)
        if BIAS_GRAD:
            dbias += ds
        dq = _dot(ds.to(q.dtype), k, PRECISION, UPCAST)
        acc_rows = _window_base(b, p0, p1, p2, sab, sa0, sa1, sa2) + a_rows
        acc_at = ACCh + acc_rows[:, None] + tl.arange(0, BLOCK_D)[None, :]
        if not FIRST_KP:
            dq += tl.load(acc_at, mask=q_ok[:, None], other=0.0)
        if LAST_KP:
            _store_rows(DQh, _window_base(b, p0, p1, p2, sdqb, sdq0, sdq1, sdq2) + dq_rows, q_ok, D, dq * scale,
                        BLOCK_D, ALIGN)
        else:
            tl.store(acc_at, dq, mask=q_ok[:, None])
        b, g0, w0, g1, w1, g2, w2 = _next_window(b, g0, w0, g1, w1, g2, w2, NW0, NW1, NW2, DL0, DL1, DL2,
                                                 RANK, DILATED0, DILATED1, DILATED2)
    if BIAS_GRAD:
        tl.store(_bias_slice(DBIASp, h, 0, QFIRST, QSIZE, KFIRST, KSIZE, VP), dbias)
    # The next key part reads delta and the dQ scratch that other threads of this program wrote.
    tl.debug_barrier()


@triton.jit
def _dq_query_part(
    Qh, Kh, Vh, Oh, Lh, DOh, GLh, Ah, DQh, ACCh, BIAS, DBIASp, h, first_win, count, zero,
    sqb, sq0, sq1, sq2, skb, sk0, sk1, sk2, svb, sv0, sv1, sv2, sob, so0, so1, so2, slb, sl0, sl1, sl2,
    sdob, sdo0, sdo1, sdo2, sdqb, sdq0, sdq1, sdq2, sab, sa0, sa1, sa2,
    L0, L1, L2, NW0, NW1, NW2, OFF0, OFF1, OFF2, DL0, DL1, DL2, scale, softcap,
    QFIRST: tl.constexpr, QSIZE: tl.constexpr,
    P0: tl.constexpr, P1: tl.constexpr, P2: tl.constexpr, P3: tl.constexpr,
    D: tl.constexpr, DV: tl.constexpr, W0: tl.constexpr, W1: tl.constexpr, W2: tl.constexpr, RANK: tl.constexpr,
    DILATED0: tl.constexpr, DILATED1: tl.constexpr, DILATED2: tl.constexpr,
    CAUSAL0: tl.constexpr, CAUSAL1: tl.constexpr, CAUSAL2: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, HAS_BIAS: tl.constexpr, BIAS_GRAD: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr, HAS_GLSE: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
    ALIGN: tl.constexpr, NUM_STAGES: tl.constexpr,
):
    """dQ (and rpb-gradient rows) of one query part: its key parts in turn."""
    VP: tl.constexpr = P0 + P1 + P2 + P3
    for k_part in tl.static_range(4):
        if _part_size(k_part, P0, P1, P2, P3) > 0:
            _dq_key_part(
                Qh, Kh, Vh, Oh, Lh, DOh, GLh, Ah, DQh, ACCh, BIAS, DBIASp, h, first_win, count, zero,
                sqb, sq0, sq1, sq2, skb, sk0, sk1, sk2, svb, sv0, sv1, sv2, sob, so0, so1, so2, slb, sl0, sl1, sl2,
                sdob, sdo0, sdo1, sdo2, sdqb, sdq0, sdq1, sdq2, sab, sa0, sa1, sa2,
                L0, L1, L2, NW0, NW1, NW2, OFF0, OFF1, OFF2, DL0, DL1, DL2, scale, softcap,
                QFIRST, QSIZE, _part_first(k_part, P0, P1, P2, P3), _part_size(k_part, P0, P1, P2, P3), VP,
                k_part == 0, _part_size(k_part + 1, P0, P1, P2, P3) == 0, D, DV, W0, W1, W2, RANK,
                DILATED0, DILATED1, DILATED2, CAUSAL0, CAUSAL1, CAUSAL2, BLOCK_D, BLOCK_DV, HAS_BIAS, BIAS_GRAD,
                HAS_SOFTCAP, HAS_GLSE, PRECISION, UPCAST, ALIGN, NUM_STAGES)


@triton.jit(do_not_specialize=LONG_RUNTIME_SIZES)
def window_long_dq_kernel(
    Q, K, V, O, LSE, DO, GLSE, BIAS, DQ, DELTA, ACC, DBIAS,
    sqb, sq0, sq1, sq2, sqh,
    skb, sk0, sk1, sk2, skh,
    svb, sv0, sv1, sv2, svh,
    sob, so0, so1, so2, soh,
    slb, sl0, sl1, sl2, slh,
    sdob, sdo0, sdo1, sdo2, sdoh,
    sdqb, sdq0, sdq1, sdq2, sdqh,
    sab, sa0, sa1, sa2, sah,
    batch, L0, L1, L2, NW0, NW1, NW2, OFF0, OFF1, OFF2, DL0, DL1, DL2,
    num_windows, windows_per_program,
    H, G, scale, softcap, zero,
    D: tl.constexpr, DV: tl.constexpr,
    W0: tl.constexpr, W1: tl.constexpr, W2: tl.constexpr, RANK: tl.constexpr,
    DILATED0: tl.constexpr, DILATED1: tl.constexpr, DILATED2: tl.constexpr,
    CAUSAL0: tl.constexpr, CAUSAL1: tl.constexpr, CAUSAL2: tl.constexpr,
    P0: tl.constexpr, P1: tl.constexpr, P2: tl.constexpr, P3: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    HAS_BIAS: tl.constexpr, BIAS_GRAD: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_GLSE: tl.constexpr,
    PRECISION: tl.constexpr, UPCAST: tl.constexpr, ALIGN: tl.constexpr, NUM_STAGES: tl.constexpr,
):
    """dQ, delta and the rpb-gradient partial of query head ``h``, query part ``part``, for
    ``windows_per_program`` consecutive windows (program order as the forward's). The partial is
    the program's query rows of ``DBIAS[run, h]`` (``[runs, H, VP, VP]``), summed by the host."""
    NUM_PARTS: tl.constexpr = (P0 > 0) + (P1 > 0) + (P2 > 0) + (P3 > 0)
    VP: tl.constexpr = P0 + P1 + P2 + P3
    pid = tl.program_id(0)
    h = pid % H
    rest = pid // H
    part = rest % NUM_PARTS
    run = rest // NUM_PARTS
    first_win = run * windows_per_program
    count = tl.minimum(windows_per_program, num_windows - first_win)
    kv_h = h // G
    Qh = Q + h * sqh * ALIGN
    Kh = K + kv_h * skh * ALIGN
    Vh = V + kv_h * svh * ALIGN
    Oh = O + h * soh * ALIGN
    Lh = LSE + h * slh
    GLh = GLSE + h * slh
    Ah = DELTA + h * slh
    DOh = DO + h * sdoh * ALIGN
    DQh = DQ + h * sdqh * ALIGN
    ACCh = ACC + h * sah
    DBIASp = DBIAS + run.to(tl.int64) * H * (VP * VP)
    for q_part in tl.static_range(4):
        if _part_size(q_part, P0, P1, P2, P3) > 0:
            if part == q_part:
                _dq_query_part(
                    Qh, Kh, Vh, Oh, Lh, DOh, GLh, Ah, DQh, ACCh, BIAS, DBIASp, h, first_win, count, zero,
                    sqb, sq0, sq1, sq2, skb, sk0, sk1, sk2, svb, sv0, sv1, sv2, sob, so0, so1, so2, slb, sl0, sl1, sl2,
                    sdob, sdo0, sdo1, sdo2, sdqb, sdq0, sdq1, sdq2, sab, sa0, sa1, sa2,
                    L0, L1, L2, NW0, NW1, NW2, OFF0, OFF1, OFF2, DL0, DL1, DL2, scale, softcap,
                    _part_first(q_part, P0, P1, P2, P3), _part_size(q_part, P0, P1, P2, P3), P0, P1, P2, P3,
                    D, DV, W0, W1, W2, RANK, DILATED0, DILATED1, DILATED2, CAUSAL0, CAUSAL1, CAUSAL2,
                    BLOCK_D, BLOCK_DV, HAS_BIAS, BIAS_GRAD, HAS_SOFTCAP, HAS_GLSE, PRECISION, UPCAST, ALIGN, NUM_STAGES)


@triton.jit
def _dkdv_step(k, v, dk, dv, Qh, DOh, q_base, do_base, Lw, Aw, BIAS, h, salt, kc0, kc1, kc2, k_ok, p0, p1, p2,
               sq0, sq1, sq2, sdo0, sdo1, sdo2, sl0, sl1, sl2, L0, L1, L2, DL0, DL1, DL2, scale, softcap,
               QFIRST: tl.constexpr, QSIZE: tl.constexpr, KFIRST: tl.constexpr, KSIZE: tl.constexpr,
               VP: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
               W0: tl.constexpr, W1: tl.constexpr, W2: tl.constexpr, RANK: tl.constexpr,
               DILATED0: tl.constexpr, DILATED1: tl.constexpr, DILATED2: tl.constexpr,
               CAUSAL0: tl.constexpr, CAUSAL1: tl.constexpr, CAUSAL2: tl.constexpr,
               BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
               PRECISION: tl.constexpr, UPCAST: tl.constexpr, ALIGN: tl.constexpr):
    """One query part's contribution to a key part's dK (unscaled) and dV, for one window."""
    qc0, qc1, qc2, q_slot, qd0, qd1, qd2 = _part_slots(QFIRST, QSIZE, W0, W1, W2, DL0, DL1, DL2,
                                                       DILATED0, DILATED1, DILATED2)
    q_ok = _on_grid(p0, p1, p2, qd0, qd1, qd2, q_slot, L0, L1, L2, RANK)
    q, do, lse, delta = _query_rows_state(
        Qh, DOh, Lw, Aw, q_base + _relative_offsets(qc0, qc1, qc2, DL0, DL1, DL2, sq0, sq1, sq2),
        do_base + _relative_offsets(qc0, qc1, qc2, DL0, DL1, DL2, sdo0, sdo1, sdo2),
        _relative_offsets(qc0, qc1, qc2, DL0, DL1, DL2, sl0, sl1, sl2), q_ok, D, DV, BLOCK_D, BLOCK_DV, ALIGN)
    bias = 0.0
    if HAS_BIAS:
        bias = tl.load(_bias_slice(BIAS, h, salt, QFIRST, QSIZE, KFIRST, KSIZE, VP))
    keep = _keep(k_ok, qc0, qc1, qc2, kc0, kc1, kc2, CAUSAL0, CAUSAL1, CAUSAL2)
    p, ds = _score_gradient(q, k, v, do, lse, delta, bias, keep, scale, softcap,
                            HAS_BIAS, HAS_SOFTCAP, PRECISION, UPCAST)
    dv += _dot(tl.trans(p.to(do.dtype)), do, PRECISION, UPCAST)
    dk += _dot(tl.trans(ds.to(q.dtype)), q, PRECISION, UPCAST)
    return dk, dv


@triton.jit
def _dkdv_key_part(
    Qh, Kh, Vh, Lh, DOh, Ah, DKh, DVh, BIAS, h, first_win, count, zero,
    sqb, sq0, sq1, sq2, skb, sk0, sk1, sk2, svb, sv0, sv1, sv2, slb, sl0, sl1, sl2,
    sdob, sdo0, sdo1, sdo2, sdkb, sdk0, sdk1, sdk2, sdvb, sdv0, sdv1, sdv2,
    L0, L1, L2, NW0, NW1, NW2, OFF0, OFF1, OFF2, DL0, DL1, DL2, scale, softcap,
    KFIRST: tl.constexpr, KSIZE: tl.constexpr,
    P0: tl.constexpr, P1: tl.constexpr, P2: tl.constexpr, P3: tl.constexpr,
    D: tl.constexpr, DV: tl.constexpr, W0: tl.constexpr, W1: tl.constexpr, W2: tl.constexpr, RANK: tl.constexpr,
    DILATED0: tl.constexpr, DILATED1: tl.constexpr, DILATED2: tl.constexpr,
    CAUSAL0: tl.constexpr, CAUSAL1: tl.constexpr, CAUSAL2: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
    PRECISION: tl.constexpr, UPCAST: tl.constexpr, ALIGN: tl.constexpr, NUM_STAGES: tl.constexpr,
):
    """dK and dV of one key part over ``count`` windows: per window, every query part in turn."""
    VP: tl.constexpr = P0 + P1 + P2 + P3
    kc0, kc1, kc2, k_slot, kd0, kd1, kd2 = _part_slots(KFIRST, KSIZE, W0, W1, W2, DL0, DL1, DL2,
                                                       DILATED0, DILATED1, DILATED2)
    k_rows = _relative_offsets(kc0, kc1, kc2, DL0, DL1, DL2, sk0, sk1, sk2)
    v_rows = _relative_offsets(kc0, kc1, kc2, DL0, DL1, DL2, sv0, sv1, sv2)
    dk_rows = _relative_offsets(kc0, kc1, kc2, DL0, DL1, DL2, sdk0, sdk1, sdk2)
    dv_rows = _relative_offsets(kc0, kc1, kc2, DL0, DL1, DL2, sdv0, sdv1, sdv2)
    b, g0, w0, g1, w1, g2, w2 = _first_window(first_win, NW0, NW1, NW2, DL0, DL1, DL2,
                                              RANK, DILATED0, DILATED1, DILATED2)
    for i in tl.range(0, count, num_stages=NUM_STAGES):
        p0, p1, p2 = _window_first_slots(g0, w0, g1, w1, g2, w2, DL0, DL1, DL2, OFF0, OFF1, OFF2, W0, W1, W2,
                                         DILATED0, DILATED1, DILATED2)
        k_ok = _on_grid(p0, p1, p2, kd0, kd1, kd2, k_slot, L0, L1, L2, RANK)
        k = _load_rows(Kh, _window_base(b, p0, p1, p2, skb, sk0, sk1, sk2) + k_rows, k_ok, D, BLOCK_D, ALIGN)
        v = _load_rows(Vh, _window_base(b, p0, p1, p2, svb, sv0, sv1, sv2) + v_rows, k_ok, DV, BLOCK_DV, ALIGN)
        q_base = _window_base(b, p0, p1, p2, sqb, sq0, sq1, sq2)
        do_base = _window_base(b, p0, p1, p2, sdob, sdo0, sdo1, sdo2)
        salt = _salt(i, zero)
        lse_base = _window_base(b, p0, p1, p2, slb, sl0, sl1, sl2)
        Lw = Lh + lse_base
        Aw = Ah + lse_base
        dk = tl.zeros((KSIZE, BLOCK_D), tl.float32)
        dv = tl.zeros((KSIZE, BLOCK_DV), tl.float32)
        for q_part in tl.static_range(4):
            if _part_size(q_part, P0, P1, P2, P3) > 0:
                dk, dv = _dkdv_step(
                    k, v, dk, dv, Qh, DOh, q_base, do_base, Lw, Aw, BIAS, h, salt, kc0, kc1, kc2, k_ok, p0, p1, p2,
                    sq0, sq1, sq2, sdo0, sdo1, sdo2, sl0, sl1, sl2, L0, L1, L2, DL0, DL1, DL2, scale, softcap,
                    _part_first(q_part, P0, P1, P2, P3), _part_size(q_part, P0, P1, P2, P3), KFIRST, KSIZE, VP,
                    D, DV, W0, W1, W2, RANK, DILATED0, DILATED1, DILATED2, CAUSAL0, CAUSAL1, CAUSAL2,
                    BLOCK_D, BLOCK_DV, HAS_BIAS, HAS_SOFTCAP, PRECISION, UPCAST, ALIGN)
        _store_rows(DKh, _window_base(b, p0, p1, p2, sdkb, sdk0, sdk1, sdk2) + dk_rows, k_ok, D, dk * scale,
                    BLOCK_D, ALIGN)
        _store_rows(DVh, _window_base(b, p0, p1, p2, sdvb, sdv0, sdv1, sdv2) + dv_rows, k_ok, DV, dv, BLOCK_DV, ALIGN)
        b, g0, w0, g1, w1, g2, w2 = _next_window(b, g0, w0, g1, w1, g2, w2, NW0, NW1, NW2, DL0, DL1, DL2,
                                                 RANK, DILATED0, DILATED1, DILATED2)


@triton.jit(do_not_specialize=LONG_RUNTIME_SIZES)
def window_long_dkdv_kernel(
    Q, K, V, LSE, DO, DELTA, BIAS, DK, DV_OUT,
    sqb, sq0, sq1, sq2, sqh,
    skb, sk0, sk1, sk2, skh,
    svb, sv0, sv1, sv2, svh,
    slb, sl0, sl1, sl2, slh,
    sdob, sdo0, sdo1, sdo2, sdoh,
    sdkb, sdk0, sdk1, sdk2, sdkh,
    sdvb, sdv0, sdv1, sdv2, sdvh,
    batch, L0, L1, L2, NW0, NW1, NW2, OFF0, OFF1, OFF2, DL0, DL1, DL2,
    num_windows, windows_per_program,
    H, G, scale, softcap, zero,
    D: tl.constexpr, DV: tl.constexpr,
    W0: tl.constexpr, W1: tl.constexpr, W2: tl.constexpr, RANK: tl.constexpr,
    DILATED0: tl.constexpr, DILATED1: tl.constexpr, DILATED2: tl.constexpr,
    CAUSAL0: tl.constexpr, CAUSAL1: tl.constexpr, CAUSAL2: tl.constexpr,
    P0: tl.constexpr, P1: tl.constexpr, P2: tl.constexpr, P3: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
    PRECISION: tl.constexpr, UPCAST: tl.constexpr, ALIGN: tl.constexpr, NUM_STAGES: tl.constexpr,
):
    """dK and dV of query head ``h`` (per query head: the host sums a GQA group), key part
    ``part``, for ``windows_per_program`` consecutive windows. Reads the delta the dQ kernel
    stored."""
    NUM_PARTS: tl.constexpr = (P0 > 0) + (P1 > 0) + (P2 > 0) + (P3 > 0)
    pid = tl.program_id(0)
    h = pid % H
    rest = pid // H
    part = rest % NUM_PARTS
    first_win = (rest // NUM_PARTS) * windows_per_program
    count = tl.minimum(windows_per_program, num_windows - first_win)
    kv_h = h // G
    Qh = Q + h * sqh * ALIGN
    Kh = K + kv_h * skh * ALIGN
    Vh = V + kv_h * svh * ALIGN
    Lh = LSE + h * slh
    Ah = DELTA + h * slh
    DOh = DO + h * sdoh * ALIGN
    DKh = DK + h * sdkh * ALIGN
    DVh = DV_OUT + h * sdvh * ALIGN
    for k_part in tl.static_range(4):
        if _part_size(k_part, P0, P1, P2, P3) > 0:
            if part == k_part:
                _dkdv_key_part(
                    Qh, Kh, Vh, Lh, DOh, Ah, DKh, DVh, BIAS, h, first_win, count, zero,
                    sqb, sq0, sq1, sq2, skb, sk0, sk1, sk2, svb, sv0, sv1, sv2, slb, sl0, sl1, sl2,
                    sdob, sdo0, sdo1, sdo2, sdkb, sdk0, sdk1, sdk2, sdvb, sdv0, sdv1, sdv2,
                    L0, L1, L2, NW0, NW1, NW2, OFF0, OFF1, OFF2, DL0, DL1, DL2, scale, softcap,
                    _part_first(k_part, P0, P1, P2, P3), _part_size(k_part, P0, P1, P2, P3), P0, P1, P2, P3,
                    D, DV, W0, W1, W2, RANK, DILATED0, DILATED1, DILATED2, CAUSAL0, CAUSAL1, CAUSAL2,
                    BLOCK_D, BLOCK_DV, HAS_BIAS, HAS_SOFTCAP, PRECISION, UPCAST, ALIGN, NUM_STAGES)
