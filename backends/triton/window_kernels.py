"""Triton kernels for short-window attention (pattern "window", windows of at most 128 padded
slots; window_long_kernels.py runs the larger ones).

One program owns one attention head and a run of consecutive windows, which it walks in a
software-pipelined loop (the next window's tokens load while this one computes). A window's tokens
are read in place from the strided ``[B, *spatial, H, D]`` tensors (no roll, pad or partition
copy) into a ``BLOCK``-slot tile, ``BLOCK`` being the window volume rounded up to a power of two;
tokens outside the grid (partial edge windows of a shifted or ragged axis) and the padding past
the window volume are masked. The whole score tile stays on chip, so the softmax is exact in one
pass and the backward pass needs no atomics: every token belongs to exactly one window.

Why the work is laid out this way (the H100 profile of the first version: 255 registers and
spills, two programs per SM, each waiting on its own loads):

* Everything that does not depend on the window is computed once per program, outside the loop:
  each slot's in-window coordinates and its element offset relative to the window's first slot
  (per tensor), and the head's bias tile. Per window only scalars change: the
  window's first-slot position per axis, from a mixed-radix cursor that steps from one window to
  the next with compares and selects (decoding a window index took seven integer divisions,
  and the in-grid ranges one more per axis: a third of the forward loop; see ``_first_window``).
* Offsets inside one batch element are int32 (the host checks they fit); only the batch term is
  int64, once per window, as a scalar.
* The bias tile arrives pre-multiplied by log2(e) (no softcap), so a score costs one FMA before
  the exp2.

Grids are always handled as rank 3 (missing leading axes have length 1 and window 1). Every size
that changes with batch or grid (lengths, window counts, and the strides that follow them) is a
runtime argument excluded from Triton's integer specialisation, so a new batch or grid size reuses
the compiled kernel.
"""

import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)

# Runtime sizes, and the batch/spatial strides that change with them, must not trigger a
# recompilation: they are excluded from Triton's specialisation. Row alignment, which that
# specialisation would have proven, comes from the ALIGN constexpr instead (a property of the
# channel layout, not of the grid): strides (head strides too) arrive divided by ALIGN and offsets
# are multiplied back by it, which proves the rows ALIGN-aligned so loads vectorise. Vectorised
# 16-bit loads matter beyond bandwidth: cp.async moves 4, 8 or 16 bytes, so the pipeliner only
# makes float16/bfloat16 loads asynchronous when at least two channels provably travel together
# (likewise D and DV are constexpr, see _row_mask).
_RUNTIME_SIZES = [
    "batch", "L0", "L1", "L2", "NW0", "NW1", "NW2", "OFF0", "OFF1", "OFF2",
    "DL0", "DL1", "DL2", "num_windows", "windows_per_program",
] + [f"s{t}{axis}" for t in ("q", "k", "v", "o", "do", "dq", "dk", "dv") for axis in ("b", "0", "1", "2")] + [
    "slb", "sl0", "sl1", "sl2", "slh",
]


@triton.jit
def _slot_coords(first, SLOTS: tl.constexpr, W0: tl.constexpr, W1: tl.constexpr, W2: tl.constexpr):
    """In-window coordinates of slots ``first + [0, SLOTS)`` and whether each is a window slot
    (not padding past the window volume). Window-independent: computed once per program."""
    slot = first + tl.arange(0, SLOTS)
    return slot // (W1 * W2), (slot // W2) % W1, slot % W2, slot < W0 * W1 * W2


@triton.jit
def _relative_offsets(c0, c1, c2, DL0, DL1, DL2, s0, s1, s2):
    """Element offset (in ALIGN units) of each slot from the window's first slot: slot coordinate
    c on an axis sits c * dilation grid positions further. Window-independent."""
    return c0 * (DL0 * s0) + c1 * (DL1 * s1) + c2 * (DL2 * s2)


@triton.jit
def _digit(rest, radix, USED: tl.constexpr):
    """Split the lowest digit (base ``radix``) off ``rest``; a digit that is always 0 (a padded
    axis, or the dilation group of an undilated axis) costs nothing."""
    if USED:
        return rest % radix, rest // radix
    return 0, rest


@triton.jit
def _first_window(win, NW0, NW1, NW2, DL0, DL1, DL2,
                  RANK: tl.constexpr, DILATED0: tl.constexpr, DILATED1: tl.constexpr, DILATED2: tl.constexpr):
    """Mixed-radix digits of window ``win`` (batch, then per axis its dilation group and its window
    in that group, windows fastest): the cursor that ``_next_window`` advances. The only integer
    divisions of a program: per window, the cursor costs a few compares and selects instead of the
    ~25 instructions each runtime division compiles to (seven per window were a fifth of the
    forward loop). Axes padded to rank 3 have one window and one group."""
    w2, rest = _digit(win, NW2, True)
    g2, rest = _digit(rest, DL2, DILATED2)
    w1, rest = _digit(rest, NW1, RANK >= 2)
    g1, rest = _digit(rest, DL1, DILATED1 and RANK >= 2)
    w0, rest = _digit(rest, NW0, RANK >= 3)
    g0, rest = _digit(rest, DL0, DILATED0 and RANK >= 3)
    return rest, g0, w0, g1, w1, g2, w2


@triton.jit
def _carry(digit, radix, carry_in, USED: tl.constexpr):
    """One digit of the cursor plus ``carry_in`` (0 or 1): the new digit and the carry out."""
    if USED:
        digit = digit + carry_in
        wrap = digit == radix
        return tl.where(wrap, 0, digit), wrap.to(tl.int32)
    return digit, carry_in


@triton.jit
def _next_window(b, g0, w0, g1, w1, g2, w2, NW0, NW1, NW2, DL0, DL1, DL2,
                 RANK: tl.constexpr, DILATED0: tl.constexpr, DILATED1: tl.constexpr, DILATED2: tl.constexpr):
    """The cursor of the next window (the order of ``_first_window``)."""
    w2, carry = _carry(w2, NW2, 1, True)
    g2, carry = _carry(g2, DL2, carry, DILATED2)
    w1, carry = _carry(w1, NW1, carry, RANK >= 2)
    g1, carry = _carry(g1, DL1, carry, DILATED1 and RANK >= 2)
    w0, carry = _carry(w0, NW0, carry, RANK >= 3)
    g0, carry = _carry(g0, DL0, carry, DILATED0 and RANK >= 3)
    return b + carry, g0, w0, g1, w1, g2, w2


@triton.jit
def _first_slot(group, w, DL, OFF, W: tl.constexpr, DILATED: tl.constexpr):
    """Grid position of the first slot of window ``w`` of dilation group ``group`` on one axis
    (before the grid for a shifted axis' first, partial window)."""
    if DILATED:
        return group + DL * (w * W - OFF)
    return w * W - OFF


@triton.jit
def _window_first_slots(g0, w0, g1, w1, g2, w2, DL0, DL1, DL2, OFF0, OFF1, OFF2,
                        W0: tl.constexpr, W1: tl.constexpr, W2: tl.constexpr,
                        DILATED0: tl.constexpr, DILATED1: tl.constexpr, DILATED2: tl.constexpr):
    """``_first_slot`` of the cursor's window on every axis."""
    return (_first_slot(g0, w0, DL0, OFF0, W0, DILATED0), _first_slot(g1, w1, DL1, OFF1, W1, DILATED1),
            _first_slot(g2, w2, DL2, OFF2, W2, DILATED2))


@triton.jit
def _dilated(c0, c1, c2, DL0, DL1, DL2, DILATED0: tl.constexpr, DILATED1: tl.constexpr, DILATED2: tl.constexpr):
    """In-window coordinates times each axis' dilation: grid steps from the window's first slot."""
    if DILATED0:
        c0 = c0 * DL0
    if DILATED1:
        c1 = c1 * DL1
    if DILATED2:
        c2 = c2 * DL2
    return c0, c1, c2


@triton.jit
def _axis_on_grid(p, cd, L):
    """Slots whose position on one axis (first slot ``p`` plus ``cd`` = in-window coordinate times
    dilation) lies in ``[0, L)``: one unsigned compare covers both ends."""
    return (p + cd).to(tl.uint32, bitcast=True) < L.to(tl.uint32, bitcast=True)


@triton.jit
def _on_grid(p0, p1, p2, cd0, cd1, cd2, is_slot, L0, L1, L2, RANK: tl.constexpr):
    """Slots that lie in the grid: a partial window's missing slots and a short dilation group's
    empty windows drop out by position, with no division for an in-window coordinate range.
    Axes added to pad the grid to rank 3 (length 1, window 1) hold every slot: not tested."""
    ok = is_slot & _axis_on_grid(p2, cd2, L2)
    if RANK >= 2:
        ok = ok & _axis_on_grid(p1, cd1, L1)
    if RANK >= 3:
        ok = ok & _axis_on_grid(p0, cd0, L0)
    return ok


@triton.jit
def _window_base(b, p0, p1, p2, sb, s0, s1, s2):
    """Offset of the window's first slot: int64 batch term, int32 within the batch element."""
    return b.to(tl.int64) * sb + (p0 * s0 + p1 * s1 + p2 * s2)


@triton.jit
def _keep(k_ok, qc0, qc1, qc2, kc0, kc1, kc2,
          CAUSAL0: tl.constexpr, CAUSAL1: tl.constexpr, CAUSAL2: tl.constexpr):
    """[query, key] slot pairs that attend: the key is in the grid and, on causal axes, not after
    the query (in-window coordinates order as grid coordinates do). Rows of padding queries are
    not masked: they are never stored."""
    keep = k_ok[None, :]
    if CAUSAL0:
        keep = keep & (kc0[None, :] <= qc0[:, None])
    if CAUSAL1:
        keep = keep & (kc1[None, :] <= qc1[:, None])
    if CAUSAL2:
        keep = keep & (kc2[None, :] <= qc2[:, None])
    return keep


@triton.jit
def _row_mask(row_ok, D: tl.constexpr, BLOCK_D: tl.constexpr):
    """Rows that are in the grid, and channels below the head dim. D is a compile-time constant on
    purpose: with a runtime D the channel mask's constancy is unknown (1 element), every load is
    split into 2-byte pieces for 16-bit types, and cp.async (4 bytes at least) cannot carry them,
    so the software pipeliner leaves the float16/bfloat16 loads synchronous."""
    cols = tl.arange(0, BLOCK_D)
    if D == BLOCK_D:
        return row_ok[:, None] & (cols[None, :] < BLOCK_D)  # the channel test folds away
    return row_ok[:, None] & (cols[None, :] < D)


@triton.jit
def _load_rows(ptr, rows, row_ok, D: tl.constexpr, BLOCK_D: tl.constexpr, ALIGN: tl.constexpr):
    """``[rows, BLOCK_D]`` tile; ``ptr`` points at the window's first slot, ``rows`` in ALIGN units.
    The channel stride is 1 (the host makes it so)."""
    cols = tl.arange(0, BLOCK_D)
    return tl.load(ptr + rows[:, None] * ALIGN + cols[None, :], mask=_row_mask(row_ok, D, BLOCK_D), other=0.0)


@triton.jit
def _store_rows(ptr, rows, row_ok, D: tl.constexpr, value, BLOCK_D: tl.constexpr, ALIGN: tl.constexpr):
    cols = tl.arange(0, BLOCK_D)
    tl.store(ptr + rows[:, None] * ALIGN + cols[None, :], value.to(ptr.dtype.element_ty),
             mask=_row_mask(row_ok, D, BLOCK_D))


@triton.jit
def _dot(a, b, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """a @ b with float32 accumulation. UPCAST multiplies (exactly) in float32: Triton's CPU
    interpreter mis-multiplies bfloat16 operands."""
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    return tl.dot(a, b, input_precision=PRECISION)


@triton.jit
def _scores(q, k, bias, keep, scale, softcap,
            HAS_BIAS: tl.constexpr, HAS_SOFTCAP: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """Masked scores in log2 units (section 5: scale * q k^T + rpb, then softcap, times log2 e),
    -inf where ``keep`` is false. Without softcap the bias tile is already in log2 units. Also
    returns tanh (the capped score / softcap) for the softcap derivative."""
    s = _dot(q, tl.trans(k), PRECISION, UPCAST)
    tanh = s
    if HAS_SOFTCAP:
        s = s * scale
        if HAS_BIAS:
            s += bias
        # tanh from exp: portable to the interpreter, exact at both saturations.
        tanh = 1.0 - 2.0 / (tl.exp2((2.0 * LOG2E / softcap) * s) + 1.0)
        s = (softcap * LOG2E) * tanh
    else:
        s = s * (scale * LOG2E)
        if HAS_BIAS:
            s += bias
    return tl.where(keep, s, float("-inf")), tanh


@triton.jit(do_not_specialize=_RUNTIME_SIZES)
def window_forward_kernel(
    Q, K, V, O, LSE, BIAS,
    sqb, sq0, sq1, sq2, sqh,
    skb, sk0, sk1, sk2, skh,
    svb, sv0, sv1, sv2, svh,
    sob, so0, so1, so2, soh,
    slb, sl0, sl1, sl2, slh,
    batch, L0, L1, L2, NW0, NW1, NW2, OFF0, OFF1, OFF2, DL0, DL1, DL2,
    num_windows, windows_per_program,
    H, G, scale, softcap,
    D: tl.constexpr, DV: tl.constexpr,
    W0: tl.constexpr, W1: tl.constexpr, W2: tl.constexpr, RANK: tl.constexpr,
    DILATED0: tl.constexpr, DILATED1: tl.constexpr, DILATED2: tl.constexpr,
    CAUSAL0: tl.constexpr, CAUSAL1: tl.constexpr, CAUSAL2: tl.constexpr,
    BLOCK: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_SOFTCAP: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
    ALIGN: tl.constexpr, NUM_STAGES: tl.constexpr, RELOAD_BIAS: tl.constexpr,
):
    """Output and LSE of query head ``h`` for ``windows_per_program`` consecutive windows: the
    whole ``BLOCK x BLOCK`` score tile of each window at once (one pass: exact softmax)."""
    # Heads vary fastest across programs so the heads of one window run side by side and share
    # the window's cache lines.
    pid = tl.program_id(0)
    h = pid % H
    first_win = (pid // H) * windows_per_program
    kv_h = h // G

    qc0, qc1, qc2, q_slot = _slot_coords(0, BLOCK, W0, W1, W2)
    kc0, kc1, kc2, k_slot = qc0, qc1, qc2, q_slot  # keys are the same slots as queries
    q_rows = _relative_offsets(qc0, qc1, qc2, DL0, DL1, DL2, sq0, sq1, sq2)
    o_rows = _relative_offsets(qc0, qc1, qc2, DL0, DL1, DL2, so0, so1, so2)
    l_rows = _relative_offsets(qc0, qc1, qc2, DL0, DL1, DL2, sl0, sl1, sl2)
    k_rows = _relative_offsets(kc0, kc1, kc2, DL0, DL1, DL2, sk0, sk1, sk2)
    v_rows = _relative_offsets(kc0, kc1, kc2, DL0, DL1, DL2, sv0, sv1, sv2)
    bias_tile = BIAS + h * (BLOCK * BLOCK) + tl.arange(0, BLOCK)[:, None] * BLOCK + tl.arange(0, BLOCK)[None, :]
    bias = 0.0
    if HAS_BIAS:
        if not RELOAD_BIAS:
            bias = tl.load(bias_tile)
    Qh = Q + h * sqh * ALIGN
    Kh = K + kv_h * skh * ALIGN
    Vh = V + kv_h * svh * ALIGN
    Oh = O + h * soh * ALIGN
    Lh = LSE + h * slh

    qd0, qd1, qd2 = _dilated(qc0, qc1, qc2, DL0, DL1, DL2, DILATED0, DILATED1, DILATED2)
    kd0, kd1, kd2 = qd0, qd1, qd2

    count = tl.minimum(windows_per_program, num_windows - first_win)
    b, g0, w0, g1, w1, g2, w2 = _first_window(
        first_win, NW0, NW1, NW2, DL0, DL1, DL2, RANK, DILATED0, DILATED1, DILATED2)
    for i in tl.range(0, count, num_stages=NUM_STAGES):
        p0, p1, p2 = _window_first_slots(g0, w0, g1, w1, g2, w2, DL0, DL1, DL2, OFF0, OFF1, OFF2, W0, W1, W2,
                                         DILATED0, DILATED1, DILATED2)
        q_ok = _on_grid(p0, p1, p2, qd0, qd1, qd2, q_slot, L0, L1, L2, RANK)
        k_ok = q_ok
        q = _load_rows(Qh + _window_base(b, p0, p1, p2, sqb, sq0, sq1, sq2) * ALIGN, q_rows, q_ok, D, BLOCK_D, ALIGN)
        k = _load_rows(Kh + _window_base(b, p0, p1, p2, skb, sk0, sk1, sk2) * ALIGN, k_rows, k_ok, D, BLOCK_D, ALIGN)
        v = _load_rows(Vh + _window_base(b, p0, p1, p2, svb, sv0, sv1, sv2) * ALIGN, v_rows, k_ok, DV, BLOCK_DV,
                       ALIGN)
        keep = _keep(k_ok, qc0, qc1, qc2, kc0, kc1, kc2, CAUSAL0, CAUSAL1, CAUSAL2)
        window_bias = bias
        if HAS_BIAS:
            if RELOAD_BIAS:
                window_bias = tl.load(bias_tile)
        s, _ = _scores(q, k, window_bias, keep, scale, softcap, HAS_BIAS, HAS_SOFTCAP, PRECISION, UPCAST)
        # Every real query sees at least itself, so its row max is finite; rows of padding or
        # out-of-grid slots, never stored, get a zero max so they compute no NaN either.
        m = tl.max(s, axis=1)
        m = tl.where(m == float("-inf"), 0.0, m)
        p = tl.exp2(s - m[:, None])
        total = tl.sum(p, axis=1)
        out = _dot(p.to(v.dtype), v, PRECISION, UPCAST) * (1.0 / total)[:, None]
        _store_rows(Oh + _window_base(b, p0, p1, p2, sob, so0, so1, so2) * ALIGN, o_rows, q_ok, DV, out, BLOCK_DV,
                    ALIGN)
        lse = (m + tl.log2(total)) * LN2
        tl.store(Lh + _window_base(b, p0, p1, p2, slb, sl0, sl1, sl2) + l_rows, lse, mask=q_ok)
        b, g0, w0, g1, w1, g2, w2 = _next_window(
            b, g0, w0, g1, w1, g2, w2, NW0, NW1, NW2, DL0, DL1, DL2, RANK, DILATED0, DILATED1, DILATED2)


@triton.jit(do_not_specialize=_RUNTIME_SIZES)
def window_backward_kernel(
    Q, K, V, O, LSE, DO, GLSE, BIAS, DQ, DK, DV_OUT, DBIAS,
    sqb, sq0, sq1, sq2, sqh,
    skb, sk0, sk1, sk2, skh,
    svb, sv0, sv1, sv2, svh,
    sob, so0, so1, so2, soh,
    slb, sl0, sl1, sl2, slh,
    sdob, sdo0, sdo1, sdo2, sdoh,
    sdqb, sdq0, sdq1, sdq2, sdqh,
    sdkb, sdk0, sdk1, sdk2, sdkh,
    sdvb, sdv0, sdv1, sdv2, sdvh,
    batch, L0, L1, L2, NW0, NW1, NW2, OFF0, OFF1, OFF2, DL0, DL1, DL2,
    num_windows, windows_per_program,
    H, G, scale, softcap,
    D: tl.constexpr, DV: tl.constexpr,
    W0: tl.constexpr, W1: tl.constexpr, W2: tl.constexpr, RANK: tl.constexpr,
    DILATED0: tl.constexpr, DILATED1: tl.constexpr, DILATED2: tl.constexpr,
    CAUSAL0: tl.constexpr, CAUSAL1: tl.constexpr, CAUSAL2: tl.constexpr,
    BLOCK: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    HAS_BIAS: tl.constexpr, BIAS_GRAD: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_GLSE: tl.constexpr,
    PRECISION: tl.constexpr, UPCAST: tl.constexpr, ALIGN: tl.constexpr, NUM_STAGES: tl.constexpr,
):
    """dQ, dK, dV of query head ``h`` for ``windows_per_program`` consecutive windows, each
    window's whole score tile at once. dK/dV are written per query head (the caller sums the query
    heads of a GQA group). The rpb gradient is this program's dS summed over its windows in
    registers, one ``BLOCK x BLOCK`` partial per program that the caller reduces: deterministic,
    no atomics."""
    pid = tl.program_id(0)
    h = pid % H
    kv_h = h // G
    first_win = (pid // H) * windows_per_program

    kc0, kc1, kc2, k_slot = _slot_coords(0, BLOCK, W0, W1, W2)
    k_rows = _relative_offsets(kc0, kc1, kc2, DL0, DL1, DL2, sk0, sk1, sk2)
    v_rows = _relative_offsets(kc0, kc1, kc2, DL0, DL1, DL2, sv0, sv1, sv2)
    dk_rows = _relative_offsets(kc0, kc1, kc2, DL0, DL1, DL2, sdk0, sdk1, sdk2)
    dv_rows = _relative_offsets(kc0, kc1, kc2, DL0, DL1, DL2, sdv0, sdv1, sdv2)
    cols = tl.arange(0, BLOCK)
    bias_ptr = BIAS + h * (BLOCK * BLOCK)
    bias = 0.0
    if HAS_BIAS:
        bias = tl.load(bias_ptr + cols[:, None] * BLOCK + cols[None, :])
    dbias = tl.zeros((BLOCK, BLOCK), dtype=tl.float32)
    Qh = Q + h * sqh * ALIGN
    Kh = K + kv_h * skh * ALIGN
    Vh = V + kv_h * svh * ALIGN
    Oh = O + h * soh * ALIGN
    DOh = DO + h * sdoh * ALIGN
    DQh = DQ + h * sdqh * ALIGN
    DKh = DK + h * sdkh * ALIGN
    DVh = DV_OUT + h * sdvh * ALIGN

    kd0, kd1, kd2 = _dilated(kc0, kc1, kc2, DL0, DL1, DL2, DILATED0, DILATED1, DILATED2)
    # Queries are the same slots as keys: their coordinates and per-tensor row offsets.
    qc0, qc1, qc2 = kc0, kc1, kc2
    q_rows = _relative_offsets(qc0, qc1, qc2, DL0, DL1, DL2, sq0, sq1, sq2)
    o_rows = _relative_offsets(qc0, qc1, qc2, DL0, DL1, DL2, so0, so1, so2)
    do_rows = _relative_offsets(qc0, qc1, qc2, DL0, DL1, DL2, sdo0, sdo1, sdo2)
    dq_rows = _relative_offsets(qc0, qc1, qc2, DL0, DL1, DL2, sdq0, sdq1, sdq2)
    l_rows = _relative_offsets(qc0, qc1, qc2, DL0, DL1, DL2, sl0, sl1, sl2)

    count = tl.minimum(windows_per_program, num_windows - first_win)
    b, g0, w0, g1, w1, g2, w2 = _first_window(
        first_win, NW0, NW1, NW2, DL0, DL1, DL2, RANK, DILATED0, DILATED1, DILATED2)
    for i in tl.range(0, count, num_stages=NUM_STAGES):
        p0, p1, p2 = _window_first_slots(g0, w0, g1, w1, g2, w2, DL0, DL1, DL2, OFF0, OFF1, OFF2, W0, W1, W2,
                                         DILATED0, DILATED1, DILATED2)
        k_ok = _on_grid(p0, p1, p2, kd0, kd1, kd2, k_slot, L0, L1, L2, RANK)
        q_ok = k_ok
        k = _load_rows(Kh + _window_base(b, p0, p1, p2, skb, sk0, sk1, sk2) * ALIGN, k_rows, k_ok, D, BLOCK_D, ALIGN)
        v = _load_rows(Vh + _window_base(b, p0, p1, p2, svb, sv0, sv1, sv2) * ALIGN, v_rows, k_ok, DV, BLOCK_DV,
                       ALIGN)
        q = _load_rows(Qh + _window_base(b, p0, p1, p2, sqb, sq0, sq1, sq2) * ALIGN, q_rows, q_ok, D, BLOCK_D, ALIGN)
        o = _load_rows(Oh + _window_base(b, p0, p1, p2, sob, so0, so1, so2) * ALIGN, o_rows, q_ok, DV, BLOCK_DV, ALIGN)
        do = _load_rows(DOh + _window_base(b, p0, p1, p2, sdob, sdo0, sdo1, sdo2) * ALIGN, do_rows, q_ok, DV,
                        BLOCK_DV, ALIGN)
        lse_ptr = _window_base(b, p0, p1, p2, slb, sl0, sl1, sl2) + h * slh + l_rows
        # +inf for rows that are not queries: their probabilities come out 0, not inf.
        lse = tl.load(LSE + lse_ptr, mask=q_ok, other=float("inf")) * LOG2E
        delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)
        if HAS_GLSE:
            delta -= tl.load(GLSE + lse_ptr, mask=q_ok, other=0.0)
        keep = _keep(k_ok, qc0, qc1, qc2, kc0, kc1, kc2, CAUSAL0, CAUSAL1, CAUSAL2)
        s, tanh = _scores(q, k, bias, keep, scale, softcap, HAS_BIAS, HAS_SOFTCAP, PRECISION, UPCAST)
        p = tl.exp2(s - lse[:, None])
        dv = _dot(tl.trans(p.to(do.dtype)), do, PRECISION, UPCAST)
        dp = _dot(do, tl.trans(v), PRECISION, UPCAST)
        ds = p * (dp - delta[:, None])
        if HAS_SOFTCAP:
            ds = ds * (1.0 - tanh * tanh)
        if BIAS_GRAD:
            dbias += ds
        ds_in = ds.to(q.dtype)
        dq = _dot(ds_in, k, PRECISION, UPCAST) * scale
        dk = _dot(tl.trans(ds_in), q, PRECISION, UPCAST)
        _store_rows(DQh + _window_base(b, p0, p1, p2, sdqb, sdq0, sdq1, sdq2) * ALIGN, dq_rows, q_ok, D, dq, BLOCK_D,
                    ALIGN)
        _store_rows(DKh + _window_base(b, p0, p1, p2, sdkb, sdk0, sdk1, sdk2) * ALIGN, dk_rows, k_ok, D, dk * scale,
                    BLOCK_D, ALIGN)
        _store_rows(DVh + _window_base(b, p0, p1, p2, sdvb, sdv0, sdv1, sdv2) * ALIGN, dv_rows, k_ok, DV, dv,
                    BLOCK_DV, ALIGN)
        b, g0, w0, g1, w1, g2, w2 = _next_window(
            b, g0, w0, g1, w1, g2, w2, NW0, NW1, NW2, DL0, DL1, DL2, RANK, DILATED0, DILATED1, DILATED2)
    if BIAS_GRAD:
        tl.store(DBIAS + pid.to(tl.int64) * (BLOCK * BLOCK) + cols[:, None] * BLOCK + cols[None, :], dbias)
