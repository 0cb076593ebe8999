"""haloattn.integrations.natten: NATTEN's fused and unfused functional APIs, against the float64
oracle (SEMANTICS.md computed independently in tests/oracle.py), forward, gradients and JVPs."""

import functools

import pytest
import torch

import haloattn
import oracle
from haloattn.integrations import natten


def _heads_first(t):
    return t.movedim(-2, 1)


def _unfused_attention(rank, q, k, v, kernel, dilation, scale, rpb=None, ak=None, av=None):
    """NATTEN's unfused module recipe: heads-first q * scale -> na*d_qk -> softmax -> na*d_av."""
    qk = getattr(natten, f"na{rank}d_qk")
    weights = qk(q * scale, k, kernel, dilation, additional_keys=ak, rpb=rpb).softmax(dim=-1)
    return getattr(natten, f"na{rank}d_av")(weights, v, kernel, dilation, additional_values=av)


CASES = [  # rank, spatial, kernel, dilation, heads, head dim, value dim, additional tokens
    (1, (19,), 5, 3, 2, 8, 6, 2),
    (2, (7, 9), (3, 5), (2, 1), 2, 8, 8, 0),
    (2, (6, 6), 3, 1, 1, 4, 5, 3),
    (3, (4, 5, 6), (3, 2, 3), (1, 2, 2), 2, 4, 4, 0),
]


@pytest.mark.parametrize("rank,spatial,kernel,dilation,heads,dim,vdim,extra", CASES)
def test_unfused_ops_compose_to_the_oracle(rank, spatial, kernel, dilation, heads, dim, vdim, extra):
    gen = torch.Generator().manual_seed(rank * 10 + extra)
    kernel_t = (kernel,) * rank if isinstance(kernel, int) else kernel

    def rnd(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64, requires_grad=True)

    q, k = rnd(2, *spatial, heads, dim), rnd(2, *spatial, heads, dim)
    v = rnd(2, *spatial, heads, vdim)
    rpb = rnd(heads, *(2 * w - 1 for w in kernel_t))
    ak, av = (rnd(2, extra, heads, dim), rnd(2, extra, heads, vdim)) if extra else (None, None)
    scale = 0.37
    out = _unfused_attention(rank, _heads_first(q), _heads_first(k), _heads_first(v), kernel, dilation, scale, rpb,
                             None if ak is None else _heads_first(ak), None if av is None else _heads_first(av))
    ref, _ = oracle.attention(q, k, v, kernel, dilation=dilation, scale=scale, rpb=rpb, additional_keys=ak,
                              additional_values=av)
    ref = _heads_first(ref)
    assert oracle.rel_error(out, ref) < 1e-10
    grad = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    leaves = [t for t in (q, k, v, rpb, ak, av) if t is not None]
    got = torch.autograd.grad(out, leaves, grad)
    want = torch.autograd.grad(ref, leaves, grad)
    for name, g, w in zip(("q", "k", "v", "rpb", "ak", "av"), got, want):
        assert oracle.rel_error(g, w) < 1e-10, name


@pytest.mark.parametrize("rank,spatial,kernel,dilation", [(1, (11,), 4, 2), (2, (5, 8), (3, 4), (1, 2)),
                                                          (3, (3, 4, 5), 2, (1, 2, 2))])
def test_slots_are_each_window_in_row_major_order(rank, spatial, kernel, dilation):
    """Slot s of a query's weights is its s-th attended key in row-major order (NATTEN's layout),
    which softmax-then-average alone would not show (any consistent permutation passes that)."""
    gen = torch.Generator().manual_seed(rank)
    q = torch.randn(1, 1, *spatial, 3, generator=gen, dtype=torch.float64)
    k = torch.randn(1, 1, *spatial, 3, generator=gen, dtype=torch.float64)
    n = torch.Size(spatial).numel()
    weights = getattr(natten, f"na{rank}d_qk")(q, k, kernel, dilation).reshape(n, -1)
    keep = oracle.pattern_mask(spatial, kernel, dilation=dilation)  # [N, N], row-major tokens
    qf, kf = q.reshape(n, 3), k.reshape(n, 3)
    for i in range(n):
        keys = keep[i].nonzero().flatten()  # ascending flat index = row-major over the window
        assert torch.allclose(weights[i], kf[keys] @ qf[i], rtol=0, atol=1e-12), i


def test_legacy_names_match_the_new_ones():
    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(2, 3, 6, 7, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    rpb = torch.randn(3, 5, 5, generator=gen, dtype=torch.float64)
    attn = natten.natten2dqkrpb(q, k, rpb, 3, 2)
    assert torch.equal(attn, natten.na2d_qk(q, k, (3, 3), (2, 2), rpb=rpb))
    assert torch.equal(natten.natten2dqk(q, k, 3, 2), natten.na2d_qk(q, k, 3, 2))
    assert torch.equal(natten.natten2dav(attn.softmax(-1), v, 3, 2), natten.na2d_av(attn.softmax(-1), v, 3, 2))
    q3, k3 = (torch.randn(1, 2, 4, 6, 6, 4, generator=gen, dtype=torch.float64) for _ in range(2))
    rpb3 = torch.randn(2, 3, 5, 5, generator=gen, dtype=torch.float64)
    assert torch.equal(natten.natten3dqkrpb(q3, k3, rpb3, 2, 3, 1, 2),
                       natten.na3d_qk(q3, k3, (2, 3, 3), (1, 2, 2), rpb=rpb3))
    assert torch.equal(natten.natten1dav(natten.natten1dqk(q[:, :, 0], k[:, :, 0], 3, 1), v[:, :, 0], 3, 1),
                       natten.na1d_av(natten.na1d_qk(q[:, :, 0], k[:, :, 0], 3), v[:, :, 0], 3))


def test_unfused_forward_mode_matches_the_oracle():
    gen = torch.Generator().manual_seed(7)
    q, k, v, tq, tk, tv = (torch.randn(1, 2, 6, 7, 4, generator=gen, dtype=torch.float64) for _ in range(6))

    def unfused(q, k, v):
        return _unfused_attention(2, q, k, v, 3, (1, 2), 0.5)

    def reference(q, k, v):
        out, _ = oracle.attention(q.movedim(1, -2), k.movedim(1, -2), v.movedim(1, -2), 3, dilation=(1, 2), scale=0.5)
        return out.movedim(-2, 1)

    out, tangent = torch.func.jvp(unfused, (q, k, v), (tq, tk, tv))
    ref, ref_tangent = torch.func.jvp(reference, (q, k, v), (tq, tk, tv))
    assert oracle.rel_error(out, ref) < 1e-10 and oracle.rel_error(tangent, ref_tangent) < 1e-10


def test_unfused_ops_gather_in_steps(monkeypatch):
    """With a gather budget below one slot's keys every slot is its own step: same results."""
    gen = torch.Generator().manual_seed(8)
    q, k, v = (torch.randn(1, 2, 7, 6, 4, generator=gen, dtype=torch.float64, requires_grad=True) for _ in range(3))
    whole = _unfused_attention(2, q, k, v, 3, 1, 0.5)
    grads = torch.autograd.grad(whole.square().sum(), (q, k, v))
    monkeypatch.setattr(natten, "GATHER_STEP_BYTES", 1)
    stepped = _unfused_attention(2, q, k, v, 3, 1, 0.5)
    assert torch.allclose(stepped, whole, rtol=0, atol=1e-13)
    for a, b in zip(torch.autograd.grad(stepped.square().sum(), (q, k, v)), grads):
        assert torch.allclose(a, b, rtol=0, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_unfused_16_bit_weights_keep_their_dtype(dtype):
    gen = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn(1, 2, 6, 6, 8, generator=gen) for _ in range(3))
    weights = natten.na2d_qk(q.to(dtype), k.to(dtype), 3)
    assert weights.dtype == dtype
    out = natten.na2d_av(weights.softmax(-1), v.to(dtype), 3)
    ref, _ = oracle.attention(*(t.movedim(1, -2).double() for t in (q, k, v)), 3, scale=1.0)
    assert out.dtype == dtype and oracle.rel_error(out, ref.movedim(-2, 1)) < oracle.TOLERANCE[dtype]


def test_fused_calls_are_haloattn_attention():
    gen = torch.Generator().manual_seed(10)
    q, k, v = (torch.randn(2, 7, 8, 2, 8, generator=gen, dtype=torch.float64) for _ in range(3))
    ak, av = (torch.randn(2, 3, 2, 8, generator=gen, dtype=torch.float64) for _ in range(2))
    out, lse = natten.na2d(q, k, v, (3, 5), stride=(1, 2), dilation=(2, 1), is_causal=(False, True), scale=0.3,
                           additional_keys=ak, additional_values=av, return_lse=True, backend="cutlass-fna",
                           q_tile_shape=(8, 8), torch_compile=False)
    ref, ref_lse = oracle.attention(q, k, v, (3, 5), stride=(1, 2), dilation=(2, 1), causal=(False, True), scale=0.3,
                                    additional_keys=ak, additional_values=av)
    assert oracle.rel_error(out, ref) < 1e-10 and (lse - ref_lse).abs().max() < 1e-10
    merged, merged_lse = natten.merge_attentions([out, out], [lse, lse], torch_compile=False)
    assert oracle.rel_error(merged, ref) < 1e-10
    assert (merged_lse - ref_lse - torch.log(torch.tensor(2.0, dtype=torch.float64))).abs().max() < 1e-10


def test_fused_rejects_what_natten_would_read_differently():
    q = torch.randn(1, 6, 6, 2, 8)
    with pytest.raises(TypeError, match="unexpected keyword arguments \\['tile_size'\\]"):
        natten.na2d(q, q, q, 3, tile_size=8)
    with pytest.raises(TypeError):
        natten.na2d(q, q, q, 3, 2)  # NATTEN 0.17 read this 2 as the dilation, 0.20 as the stride
    with pytest.raises(ValueError, match="na1d takes \\[B, \\*spatial, H, D\\] tensors with 1 spatial axes"):
        natten.na1d(q, q, q, 3)


def test_unfused_errors_name_the_argument():
    q = torch.randn(1, 2, 6, 6, 8)
    with pytest.raises(NotImplementedError, match="causal windows are not offered by the unfused ops"):
        natten.na2d_qk(q, q, 3, is_causal=(True, False))
    with pytest.raises(ValueError, match="window 7 .*axis 0|axis 0.*window 7|7"):
        natten.na2d_qk(q, q, 7)
    with pytest.raises(ValueError, match="na2d_av: attn has shape"):
        natten.na2d_av(torch.randn(1, 2, 6, 6, 8), q, 3)
    with pytest.raises(ValueError, match="rpb has shape"):
        natten.na2d_qk(q, q, 3, rpb=torch.randn(2, 3, 3))
    with pytest.raises(ValueError, match="heads-first \\[B, H, \\*spatial, D\\] tensors with 3 spatial axes"):
        natten.na3d_qk(q, q, 3)
    with pytest.raises(ValueError, match="must have one shape"):
        natten.na2d_qk(q, q[..., :4], 3)


def test_the_modules_recipe_runs_through_haloattn_only():
    """A NATTEN <= 0.17 module body, with only its import changed, runs (here on the CPU) and
    agrees with haloattn's own module on the same weights."""
    torch.manual_seed(11)
    block = haloattn.nn.NeighborhoodAttention2d(16, 2, 3, dilation=2, rpb=True)
    x = torch.randn(2, 7, 8, 16)
    b, hh, ww, c = x.shape
    q, k, v = block.qkv(x).reshape(b, hh, ww, 3, 2, 8).permute(3, 0, 4, 1, 2, 5)
    attn = natten.natten2dqkrpb(q * 8 ** -0.5, k, block.rpb, 3, 2).softmax(dim=-1)
    out = natten.natten2dav(attn, v, 3, 2).permute(0, 2, 3, 1, 4).reshape(b, hh, ww, c)
    assert oracle.rel_error(block.proj(out), block(x)) < 1e-5


def _natten_module_class(rank):
    """A stand-in for NATTEN 0.17's NeighborhoodAttention{rank}D: its attributes and parameters,
    and its forward spelled out on the float64 oracle (NATTEN itself is not installed here)."""

    class Module(torch.nn.Module):
        def __init__(self, dim, num_heads, kernel_size, dilation, is_causal, rel_pos_bias, attn_drop=0.0):
            super().__init__()
            self.num_heads, self.head_dim = num_heads, dim // num_heads
            self.scale = self.head_dim ** -0.5
            self.kernel_size, self.dilation, self.is_causal = kernel_size, dilation, is_causal
            self.qkv = torch.nn.Linear(dim, 3 * dim)
            self.rpb = torch.nn.Parameter(torch.randn(num_heads, *(2 * k - 1 for k in kernel_size))) \
                if rel_pos_bias else None
            self.attn_drop_rate = attn_drop
            self.proj = torch.nn.Linear(dim, dim)
            self.proj_drop = torch.nn.Dropout(0.0)

        def forward(self, x):
            x = x.double()
            qkv = torch.nn.functional.linear(x, self.qkv.weight.double(), self.qkv.bias.double())
            q, k, v = qkv.reshape(*x.shape[:-1], 3, self.num_heads, self.head_dim).unbind(-3)
            out, _ = oracle.attention(q, k, v, self.kernel_size, dilation=self.dilation, causal=self.is_causal,
                                      scale=self.scale, rpb=None if self.rpb is None else self.rpb.double())
            return torch.nn.functional.linear(out.flatten(-2), self.proj.weight.double(), self.proj.bias.double())

    Module.__name__ = Module.__qualname__ = f"NeighborhoodAttention{rank}D"
    Module.__module__ = f"natten.na{rank}d"
    return Module


@pytest.mark.parametrize("rank,kernel,dilation,causal,rpb,spatial", [
    (1, (5,), (2,), (True,), False, (17,)),
    (2, (3, 5), (2, 1), (False, False), True, (7, 9)),
    (3, (2, 3, 3), (1, 1, 2), (True, False, False), False, (4, 5, 6)),
])
def test_patch_natten_runs_natten_modules_on_haloattn(rank, kernel, dilation, causal, rpb, spatial):
    torch.manual_seed(rank)
    natten_type = _natten_module_class(rank)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), natten_type(16, 2, kernel, dilation, causal, rpb))
    x = torch.randn(2, *spatial, 16)
    want = model[1](model[0](x))
    keys = model.state_dict().keys()
    assert natten.patch_natten(model) is model
    got = model(x)
    assert model.state_dict().keys() == keys
    assert oracle.rel_error(got, want) < 1e-5
    got.square().sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


def test_patch_natten_refuses_what_it_cannot_run():
    with pytest.raises(ValueError, match="has no NATTEN NeighborhoodAttention1D/2D/3D module"):
        natten.patch_natten(torch.nn.Sequential(torch.nn.Linear(4, 4)))
    dropout = _natten_module_class(2)(16, 2, (3, 3), (1, 1), (False, False), False, attn_drop=0.1)
    with pytest.raises(ValueError, match="attention dropout 0.1; haloattn has none"):
        natten.patch_natten(dropout)


def test_a_patched_natten_model_survives_torch_save_and_load(monkeypatch, tmp_path):
    """The patched forward pickles (a bound method pickled by name did not load back), and the
    loaded model still runs on haloattn."""
    import sys
    import types

    natten_type = _natten_module_class(2)
    package, home = types.ModuleType("natten"), types.ModuleType("natten.na2d")
    home.NeighborhoodAttention2D = natten_type  # where pickle looks the class up
    package.na2d = home
    monkeypatch.setitem(sys.modules, "natten", package)
    monkeypatch.setitem(sys.modules, "natten.na2d", home)
    torch.manual_seed(5)
    model = torch.nn.Sequential(natten_type(16, 2, (3, 3), (1, 1), (False, False), True))
    x = torch.randn(2, 6, 7, 16)
    want = model(x)
    natten.patch_natten(model)
    torch.save(model, tmp_path / "model.pt")
    loaded = torch.load(tmp_path / "model.pt", weights_only=False)
    assert isinstance(loaded[0].forward, functools.partial)
    assert oracle.rel_error(loaded(x), want) < 1e-5


def test_a_refused_natten_model_is_left_unpatched():
    first = _natten_module_class(1)(16, 2, (3,), (1,), (False,), False)
    second = _natten_module_class(1)(16, 2, (3,), (1,), (False,), False, attn_drop=0.1)
    model = torch.nn.Sequential(first, second)
    with pytest.raises(ValueError, match="attention dropout"):
        natten.patch_natten(model)
    assert "forward" not in vars(first)
