"""Whether Triton's host-descriptor boxes of query tiles survive the trip into registers and back,
apart from the forward kernel: a box of one query tile (host_descriptors.token_descriptors, as
the forward builds it with launch.HOST_QUERY_BOXES on) is loaded and reshaped to [rows, D]
(descriptors.load_host_box), optionally multiplied by the identity on the tensor cores (the
query tile's path into wgmma: shared memory -> dot-operand registers), then written out by
pointers and through an output box (descriptors.store_host_box). Each must equal the tile cut
from the tensor with torch, bit for bit.

On the H200 (2026-12-06) the forward went wrong at D=64 with both boxes on and right at D=128:
this tells whether the boxes are at fault (the round trip fails too) or the kernel's build. On
the H100 (2026-12-06 04:20 UTC) all 32 cases were right: the fault was the forward's register
allocation (RESULTS.md, "Query-tile boxes").

    python3 benchmarks/probe_box_roundtrip.py      # a GPU with a copy engine (sm_90), or
    TRITON_INTERPRET=1 python benchmarks/probe_box_roundtrip.py
"""

from __future__ import annotations

import itertools

import torch
import triton
import triton.language as tl

from haloattn.backends.triton.descriptor_scratch import ensure_allocator
from haloattn.backends.triton.descriptors import load_host_box, store_host_box
from haloattn.backends.triton.host_descriptors import token_descriptors

# On a machine without a GPU, run under TRITON_INTERPRET=1: the semantics the GPU build must match.
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# The interpreter multiplies bfloat16 wrongly (its tl.dot gives garbage), so there: float16.
DTYPES = (torch.bfloat16, torch.float16) if DEVICE == "cuda" else (torch.float16,)


@triton.jit
def roundtrip_kernel(QD, OD, EYE, OUT, b, head, head_width, y0, y1, y2, RANK: tl.constexpr, T0: tl.constexpr,
                     T1: tl.constexpr, T2: tl.constexpr, WIDTH: tl.constexpr, VIA_DOT: tl.constexpr):
    rows: tl.constexpr = T0 * T1 * T2
    q = load_host_box(QD, b, head, head_width, 0, y0, y1, y2, RANK, rows, WIDTH)
    if VIA_DOT:
        c = tl.arange(0, WIDTH)
        eye = tl.load(EYE + c[:, None] * WIDTH + c[None, :])
        q = tl.dot(q, eye).to(q.dtype)
    r = tl.arange(0, rows)
    c = tl.arange(0, WIDTH)
    tl.store(OUT + r[:, None] * WIDTH + c[None, :], q)
    store_host_box(OD, b, head, head_width, 0, y0, y1, y2, q, RANK, T0, T1, T2, WIDTH)


def tile_of(t, b, head, start, tile):
    """The [rows, D] tile of batch b, head h whose first token is ``start`` (rank-3 padded)."""
    rank = t.dim() - 3
    index = [b] + [slice(s, s + n) for s, n in zip(start[3 - rank:], tile[3 - rank:])] + [head]
    return t[tuple(index)].reshape(-1, t.shape[-1])


def check(spatial, tile, heads, width, via_dot, dtype):
    rank = len(spatial)
    tile3 = [1] * (3 - rank) + list(tile)
    q = torch.randn(2, *spatial, heads, width, device=DEVICE, dtype=dtype)
    out = torch.zeros_like(q)
    q_desc, _ = token_descriptors(q, rank, tile3, width, 0)
    o_desc, _ = token_descriptors(out, rank, tile3, width, 0)
    eye = torch.eye(width, device=DEVICE, dtype=dtype)
    rows = tile3[0] * tile3[1] * tile3[2]
    flat = torch.empty(rows, width, device=DEVICE, dtype=dtype)
    start = [0] * (3 - rank) + [n // 2 for n in spatial]
    b, head = 1, heads - 1
    roundtrip_kernel[(1,)](q_desc, o_desc, eye, flat, b, head, width, *start, RANK=rank, T0=tile3[0], T1=tile3[1],
                           T2=tile3[2], WIDTH=width, VIA_DOT=via_dot, num_warps=4)
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    want = tile_of(q, b, head, start, tile3)
    loaded = (flat != want).any(dim=1)
    stored = (tile_of(out, b, head, start, tile3) != want).any(dim=1)
    elsewhere = out.count_nonzero().item() - tile_of(out, b, head, start, tile3).count_nonzero().item()
    def rows_of(bad):
        return "ok" if not bad.any() else f"{int(bad.sum())} rows wrong, first {bad.nonzero()[:6].flatten().tolist()}"
    print(f"{spatial} tile {tile} H={heads} D={width} {str(dtype)[6:]} {'dot' if via_dot else 'plain'}: "
          f"load {rows_of(loaded)}; store {rows_of(stored)}; stray writes {elsewhere}", flush=True)
    if loaded.any():
        # Which query row each wrong row holds instead, if any: a permutation names the bug.
        found = [(flat[i][None, :] == want).all(dim=1).nonzero().flatten().tolist() for i in loaded.nonzero()[:4, 0]]
        print(f"    wrong rows hold rows {found}", flush=True)


def main():
    print(f"device: {torch.cuda.get_device_name() if DEVICE == 'cuda' else 'interpreter'}")
    ensure_allocator()
    cases = [((64, 64), (8, 8), 4), ((3000,), (64,), 4), ((5, 24, 24), (2, 4, 8), 4), ((40, 40), (4, 16), 4)]
    for (spatial, tile, heads), width, dtype, via_dot in itertools.product(cases, (64, 128), DTYPES, (True, False)):
        try:
            check(spatial, tile, heads, width, via_dot, dtype)
        except Exception as error:  # one failing build must not hide the other cases
            print(f"{spatial} tile {tile} D={width} dot={via_dot}: {type(error).__name__}: {error}", flush=True)


if __name__ == "__main__":
    main()
