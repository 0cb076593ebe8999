"""Token tiles through tensor descriptors (Hopper's bulk tensor copy engine, TMA).

The tokens a program streams lie in one dilation group of one batch element, under one or a few
heads: a dense box ``[heads, Lg0, Lg1, Lg2, D]`` of the ``[B, *spatial, H, D]`` tensor with
strides ``(head stride, Dl0 * s0, Dl1 * s1, Dl2 * s2, 1)``. One descriptor per program describes
it, so a tile is one copy whatever its shape, dilation is a stride (never a copy), and rows past
the grid arrive as zeros with no per-element mask or address arithmetic. The descriptor has the
problem's own rank (a padded length-1 axis would need a made-up stride), hence three spellings.
"""

import triton
import triton.language as tl


@triton.jit
def group_descriptor(base, heads, sth, Lg0, Lg1, Lg2, st0, st1, st2, DIM,
                     RANK: tl.constexpr, T0: tl.constexpr, T1: tl.constexpr, T2: tl.constexpr,
                     BLOCK_D: tl.constexpr):
    """Descriptor of one dilation group's tokens under ``heads`` heads, read one head and one
    ``T0 x T1 x T2`` box of tokens at a time."""
    if RANK == 3:
        desc = tl.make_tensor_descriptor(base, shape=[heads, Lg0, Lg1, Lg2, DIM], strides=[sth, st0, st1, st2, 1],
                                         block_shape=[1, T0, T1, T2, BLOCK_D])
    elif RANK == 2:
        desc = tl.make_tensor_descriptor(base, shape=[heads, Lg1, Lg2, DIM], strides=[sth, st1, st2, 1],
                                         block_shape=[1, T1, T2, BLOCK_D])
    else:
        desc = tl.make_tensor_descriptor(base, shape=[heads, Lg2, DIM], strides=[sth, st2, 1],
                                         block_shape=[1, T2, BLOCK_D])
    return desc


@triton.jit
def load_box(desc, head, y0, y1, y2, RANK: tl.constexpr, ROWS: tl.constexpr, BLOCK_D: tl.constexpr):
    """Head ``head``'s box whose first token is (y0, y1, y2), row-major as ``[ROWS, BLOCK_D]``."""
    if RANK == 3:
        box = desc.load([head, y0, y1, y2, 0])
    elif RANK == 2:
        box = desc.load([head, y1, y2, 0])
    else:
        box = desc.load([head, y2, 0])
    return box.reshape(ROWS, BLOCK_D)


@triton.jit
def add_to_box(desc, head, y0, y1, y2, value, RANK: tl.constexpr, T0: tl.constexpr, T1: tl.constexpr,
               T2: tl.constexpr, BLOCK_D: tl.constexpr):
    """Add ``value`` (``[T0 * T1 * T2, BLOCK_D]``, row-major) to head ``head``'s box whose first
    token is (y0, y1, y2): one bulk reduction in L2, rows and columns outside the tensor dropped."""
    if RANK == 3:
        desc.atomic_add([head, y0, y1, y2, 0], value.reshape(1, T0, T1, T2, BLOCK_D))
    elif RANK == 2:
        desc.atomic_add([head, y1, y2, 0], value.reshape(1, T1, T2, BLOCK_D))
    else:
        desc.atomic_add([head, y2, 0], value.reshape(1, T2, BLOCK_D))


@triton.jit
def load_token_tile(desc, base, s0, s1, s2, ys0, ys1, ys2, y0, y1, y2, g0, g1, g2, D0, D1, D2,
                    Lg0, Lg1, Lg2, DIM, TMA: tl.constexpr, LARGE: tl.constexpr, RANK: tl.constexpr,
                    ROWS: tl.constexpr, BLOCK_D: tl.constexpr):
    """``[ROWS, BLOCK_D]`` tile of the tokens at group coordinates (y0, y1, y2) (the box starting at
    (ys0, ys1, ys2)) of dilation group (g0, g1, g2): one descriptor copy with TMA, else a masked
    pointer gather from ``base`` through the strides; rows outside the grid (on either side) are zeros
    either way."""
    if TMA:
        tile = load_box(desc, 0, ys0, ys1, ys2, RANK, ROWS, BLOCK_D)
    else:
        # Anchored walks (index_math.tile_start) may start a tile below coordinate 0.
        ok = (y0 >= 0) & (y0 < Lg0) & (y1 >= 0) & (y1 < Lg1) & (y2 >= 0) & (y2 < Lg2)
        t0, t1, t2 = g0 + D0 * y0, g1 + D1 * y1, g2 + D2 * y2
        if LARGE:
            t0, t1, t2 = t0.to(tl.int64), t1.to(tl.int64), t2.to(tl.int64)
        cols = tl.arange(0, BLOCK_D)
        tile = tl.load(base + (t0 * s0 + t1 * s1 + t2 * s2)[:, None] + cols[None, :],
                       mask=ok[:, None] & (cols[None, :] < DIM), other=0.0)
    return tile


@triton.jit
def kv_descriptors(k_base, v_base, g0, g1, g2, sk0, sk1, sk2, skh, sv0, sv1, sv2, svh, Lg0, Lg1, Lg2,
                   D0, D1, D2, HEAD_D, HEAD_DV, TMA: tl.constexpr, RANK: tl.constexpr,
                   T0: tl.constexpr, T1: tl.constexpr, T2: tl.constexpr,
                   BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
    """Descriptors of dilation group (g0, g1, g2)'s keys and values (one head), for
    ``load_token_tile``; without TMA the bases stand in for them, unused."""
    if TMA:
        k_desc = group_descriptor(k_base + g0 * sk0 + g1 * sk1 + g2 * sk2, 1, skh, Lg0, Lg1, Lg2,
                                  D0 * sk0, D1 * sk1, D2 * sk2, HEAD_D, RANK, T0, T1, T2, BLOCK_D)
        v_desc = group_descriptor(v_base + g0 * sv0 + g1 * sv1 + g2 * sv2, 1, svh, Lg0, Lg1, Lg2,
                                  D0 * sv0, D1 * sv1, D2 * sv2, HEAD_DV, RANK, T0, T1, T2, BLOCK_DV)
    else:
        k_desc, v_desc = k_base, v_base
    return k_desc, v_desc


@triton.jit
def kv_tail_descriptors(k_base, v_base, g0, g1, g2, sk0, sk1, sk2, skh, sv0, sv1, sv2, svh, Lg0, Lg1, Lg2,
                        D0, D1, D2, HEAD_D, HEAD_DV, TMA: tl.constexpr, RANK: tl.constexpr,
                        T0: tl.constexpr, T1: tl.constexpr, T2: tl.constexpr, BLOCK_D: tl.constexpr,
                        BLOCK_DV: tl.constexpr, TAIL_D: tl.constexpr, TAIL_DV: tl.constexpr):
    """kv_descriptors for the channel tails of split heads (the kernels' TAIL_D / TAIL_DV: channels
    past BLOCK_D / BLOCK_DV), for ``load_token_tile``; a head without a tail, or no TMA, gets its
    tail's base pointer instead, unused or read by pointer."""
    k_tail = k_base + BLOCK_D
    v_tail = v_base + BLOCK_DV
    if TMA:
        if TAIL_D > 0:
            k_tail = group_descriptor(k_tail + g0 * sk0 + g1 * sk1 + g2 * sk2, 1, skh, Lg0, Lg1, Lg2,
                                      D0 * sk0, D1 * sk1, D2 * sk2, HEAD_D - BLOCK_D, RANK, T0, T1, T2, TAIL_D)
        if TAIL_DV > 0:
            v_tail = group_descriptor(v_tail + g0 * sv0 + g1 * sv1 + g2 * sv2, 1, svh, Lg0, Lg1, Lg2,
                                      D0 * sv0, D1 * sv1, D2 * sv2, HEAD_DV - BLOCK_DV, RANK, T0, T1, T2, TAIL_DV)
    return k_tail, v_tail


@triton.jit
def load_host_box(desc, b, head, head_width, channel, y0, y1, y2, RANK: tl.constexpr, ROWS: tl.constexpr,
                  WIDTH: tl.constexpr):
    """Through a host-built descriptor (host_descriptors.py): batch ``b``'s box of ``WIDTH``
    channels from ``channel`` on, of head ``head`` (``head_width`` channels a head), whose first
    token is (y0, y1, y2), row-major as ``[ROWS, WIDTH]``. At rank 3 the descriptor's last axis
    holds every head's channels back to back."""
    if RANK == 3:
        box = desc.load([b, y0, y1, y2, head * head_width + channel])
    elif RANK == 2:
        box = desc.load([b, y1, y2, head, channel])
    else:
        box = desc.load([b, y2, head, channel])
    return box.reshape(ROWS, WIDTH)


@triton.jit
def store_host_box(desc, b, head, head_width, channel, y0, y1, y2, value, RANK: tl.constexpr, T0: tl.constexpr,
                   T1: tl.constexpr, T2: tl.constexpr, WIDTH: tl.constexpr):
    """load_host_box's inverse: ``value`` (``[T0 * T1 * T2, WIDTH]``, row-major) into batch ``b``'s
    box of head ``head`` whose first token is (y0, y1, y2); the copy engine drops rows and
    channels past the tensor."""
    if RANK == 3:
        desc.store([b, y0, y1, y2, head * head_width + channel], value.reshape(1, T0, T1, T2, WIDTH))
    elif RANK == 2:
        desc.store([b, y1, y2, head, channel], value.reshape(1, T1, T2, 1, WIDTH))
    else:
        desc.store([b, y2, head, channel], value.reshape(1, T2, 1, WIDTH))


@triton.jit
def load_streamed_tile(host_desc, b, head, head_width, channel, desc, base, s0, s1, s2, ys0, ys1, ys2, y0, y1, y2,
                       g0, g1, g2, D0, D1, D2, Lg0, Lg1, Lg2, DIM, HOST_TMA: tl.constexpr, TMA: tl.constexpr,
                       LARGE: tl.constexpr, RANK: tl.constexpr, ROWS: tl.constexpr, WIDTH: tl.constexpr):
    """A streamed K or V tile: through the host-built descriptor with HOST_TMA (channels from
    ``channel`` of head ``head``, load_host_box), else load_token_tile's descriptor or pointers
    (``desc`` / ``base`` already at that head and channel)."""
    if HOST_TMA:
        tile = load_host_box(host_desc, b, head, head_width, channel, ys0, ys1, ys2, RANK, ROWS, WIDTH)
    else:
        tile = load_token_tile(desc, base, s0, s1, s2, ys0, ys1, ys2, y0, y1, y2, g0, g1, g2, D0, D1, D2,
                               Lg0, Lg1, Lg2, DIM, TMA, LARGE, RANK, ROWS, WIDTH)
    return tile
