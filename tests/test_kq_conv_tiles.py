"""The key-query convolution's tiles (backends/reference/conv_tiles.py) against the float64
oracle: tiles and blocks cut anywhere (the convolution reads c_q - 1 rows above a tile and
c_k // 2 columns beside its run of keys), every geometry the rank-1 grid allows, gradients of
every input including the kernel."""

import pytest
import torch

import haloattn
from haloattn.backends.reference import attend, conv_tiles
from haloattn.problem import build_problem

from oracle import attention as oracle_attention
from oracle import rel_error

GEOMETRIES = [
    (37, 7, {}),
    (37, 7, dict(causal=True)),
    (50, 5, dict(dilation=3)),  # the convolution's shifts cross dilation groups
    (41, 8, dict(stride=4)),
    (41, 9, dict(stride=3, causal=True, dilation=2)),
    (30, 6, dict(pattern="window", shift=2)),
    (23, 23, {}),  # window = grid: every tile's run is the whole grid
]


def _inputs(L, K, heads, kv_heads, c_q, c_k, options, seed, dtype=torch.float64, requires_grad=False):
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape, scale=1.0):
        return (scale * torch.randn(*shape, generator=gen, dtype=torch.float64)).to(dtype).requires_grad_(requires_grad)

    B, D, Dv, E = 2, 8, 6, 3
    q, k, v = randn(B, L, heads, D), randn(B, L, kv_heads, D), randn(B, L, kv_heads, Dv)
    extra = dict(kq_conv=randn(heads, c_q, c_k, scale=0.5), additional_keys=randn(B, E, kv_heads, D),
                 additional_values=randn(B, E, kv_heads, Dv), softcap=5.0)
    if options.get("pattern") != "window":
        extra["rpb"] = randn(heads, 2 * K - 1)
    return (q, k, v), {**options, **extra}


def _check_against_oracle(L, K, options, heads=4, kv_heads=2, c_q=3, c_k=5, seed=0, mask_mod=None):
    (q, k, v), kw = _inputs(L, K, heads, kv_heads, c_q, c_k, options, seed, requires_grad=True)
    if mask_mod is not None:
        kw["mask_mod"] = mask_mod
    out, lse = haloattn.attention(q, k, v, K, return_lse=True, **kw)
    ref_out, ref_lse = oracle_attention(q, k, v, K, **kw)
    assert rel_error(out, ref_out) < 1e-10
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), finite)
    assert (lse - ref_lse)[finite].abs().max() < 1e-10
    gen = torch.Generator().manual_seed(seed + 1)
    g_out = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    g_lse = torch.randn(lse.shape, generator=gen, dtype=torch.float64)
    leaves = [q, k, v] + [t for t in kw.values() if torch.is_tensor(t)]
    grads = torch.autograd.grad((out * g_out).sum() + (lse.where(finite, 0) * g_lse).sum(), leaves)
    ref_grads = torch.autograd.grad((ref_out * g_out).sum() + (ref_lse.where(finite, 0) * g_lse).sum(), leaves)
    for g, r in zip(grads, ref_grads):
        assert rel_error(g, r) < 1e-10


@pytest.mark.parametrize("L,K,options", GEOMETRIES)
@pytest.mark.parametrize("c_q,c_k", [(1, 1), (3, 5), (6, 11)])
def test_matches_the_oracle(L, K, options, c_q, c_k):
    _check_against_oracle(L, K, options, c_q=c_q, c_k=c_k, seed=L * 100 + c_q)


@pytest.mark.parametrize("L,K,options", GEOMETRIES[:5])
def test_one_tile_a_block(monkeypatch, L, K, options):
    """Blocks cut at every tile (and the grid's shorter last tile a block of its own): the
    sources of a tile's first rows lie in the block before."""
    monkeypatch.setattr(attend, "CHUNK_BYTES", 1)
    _check_against_oracle(L, K, options, c_q=4, c_k=3, seed=7)


def test_mask_mod_masks_the_sources_too():
    """mask_mod's verdict zeroes S0 before the convolution (SEMANTICS 6: keep = pattern AND
    mask_mod), and masks the convolved targets."""
    _check_against_oracle(45, 9, dict(causal=True), mask_mod=lambda b, h, q, k: (q + 2 * k + h + b) % 5 != 0, seed=3)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 1.5e-2)])
def test_lower_precisions(dtype, tol):
    (q, k, v), kw = _inputs(70, 15, 2, 2, 6, 11, dict(causal=True), seed=11, dtype=dtype)
    out = haloattn.attention(q, k, v, 15, **kw)
    assert out.dtype == dtype
    ref, _ = oracle_attention(q, k, v, 15, **kw)
    assert rel_error(out, ref) < tol


@pytest.mark.parametrize("L,K,options", GEOMETRIES)
def test_blocks_cover_every_row_once_in_order(L, K, options):
    (q, k, v), kw = _inputs(L, K, 2, 2, 3, 5, options, seed=0)
    problem = build_problem(q, k, v, K, **{n: t for n, t in kw.items() if n != "softcap"})
    for max_bytes in (1, 2**30):
        rows = torch.cat([block.rows for block in conv_tiles.blocks(problem, "cpu", max_bytes)])
        assert torch.equal(rows, torch.arange(L))


def test_tiles_share_gathers_among_rows():
    """A long window picks tiles of many rows (each tile gathers its keys once)."""
    q = k = v = torch.randn(1, 4096, 2, 16)
    problem = build_problem(q, k, v, 127, kq_conv=torch.randn(2, 6, 11))
    assert conv_tiles.tile_rows(problem) >= 16


def test_tiles_shrink_to_fit_the_block_bound():
    """A tile of the cheapest size would hold more than a block may: a smaller one is taken."""
    q = k = v = torch.randn(1, 2048, 2, 16)
    problem = build_problem(q, k, v, 1023, kq_conv=torch.randn(2, 6, 11))
    cheapest = conv_tiles.tile_rows(problem)
    budget = 4 * 2**20
    blocks = list(conv_tiles.blocks(problem, "cpu", budget))
    assert blocks[0].T < cheapest
    for block in blocks:
        Tq, Pk = block.src_rows.shape[1], block.src_cols.shape[1]
        assert block.tiles == 1 or conv_tiles.BUFFERS * 4 * 2 * block.tiles * Tq * Pk <= budget


@pytest.mark.parametrize("cpu_layout", [True, False])
@pytest.mark.parametrize("planes,heads", [(3, 4), (1, 1), (2, 1)])
def test_the_convolution_in_each_layout_against_a_loop(cpu_layout, planes, heads):
    """conv_tiles.convolve in the CPUs' layout (channels-last, grouped by head) and the other
    devices' (every plane a channel of its own, a zero plane beside a single one), with its
    gradients, against the section-6 sum written as a loop in float64."""
    gen = torch.Generator().manual_seed(planes * 10 + heads)
    s0 = torch.randn(planes, heads, 9, 12, generator=gen, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(heads, 3, 5, generator=gen, dtype=torch.float64, requires_grad=True)
    want = torch.zeros(planes, heads, 7, 8, dtype=torch.float64)
    for a in range(3):
        for t in range(5):
            want = want + weight[:, a, t].view(1, heads, 1, 1) * s0[:, :, a:a + 7, t:t + 8]
    got = conv_tiles.convolve(s0, weight, cpu_layout=cpu_layout)
    assert rel_error(got, want) < 1e-12
    seed = torch.randn(want.shape, generator=gen, dtype=torch.float64)
    grads = torch.autograd.grad((got * seed).sum(), (s0, weight))
    ref = torch.autograd.grad((want * seed).sum(), (s0, weight))
    assert all(rel_error(g, r) < 1e-12 for g, r in zip(grads, ref))
