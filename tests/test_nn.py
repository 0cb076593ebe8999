"""haloattn.nn modules: they compute projection -> attention (SEMANTICS.md) -> projection, train
(gradients reach every parameter, rpb included), and convert Swin's bias table exactly."""

import itertools

import pytest
import torch

import haloattn.nn as hnn
import oracle


def _reference_block(module, x):
    """The module's computation spelled out with the float64 oracle."""
    x = x.double()
    qkv = torch.nn.functional.linear(x, module.qkv.weight.double(), module.qkv.bias.double())
    q, k, v = qkv.unflatten(-1, (3, module.num_heads, module.head_dim)).unbind(-3)
    out, _ = oracle.attention(
        q, k, v, module.window, stride=module.stride, dilation=module.dilation, causal=module.causal,
        pattern=module.pattern, shift=module.shift,
        rpb=None if module.rpb is None else module.rpb.double(),
    )
    return torch.nn.functional.linear(out.flatten(-2), module.proj.weight.double(), module.proj.bias.double())


@pytest.mark.parametrize(
    "module, spatial",
    [
        (hnn.NeighborhoodAttention1d(16, 2, 3, rpb=True), (9,)),
        (hnn.NeighborhoodAttention2d(16, 2, (3, 2), dilation=(2, 1), causal=(True, False)), (7, 5)),
        (hnn.NeighborhoodAttention3d(16, 2, 2, stride=2, rpb=True), (4, 3, 4)),
        (hnn.WindowAttention(16, 2, 3, shift=1), (7, 6)),
        (hnn.WindowAttention(16, 2, (2, 3, 3), shift=(1, 1, 2)), (3, 6, 5)),
        (hnn.WindowAttention(16, 2, (3, 3), dilation=2, rpb=False), (6, 6)),
    ],
    ids=["na1d_rpb", "na2d_dilated_causal", "na3d_strided_rpb", "window2d_shift", "window3d", "grid_attention"],
)
def test_module_matches_oracle_and_trains(module, spatial):
    with torch.no_grad():  # random rpb, so a wrong orientation cannot hide behind Swin's tiny init
        if module.rpb is not None:
            module.rpb.normal_()
    x = torch.randn(2, *spatial, 16)
    out = module(x)
    assert out.shape == x.shape
    assert oracle.rel_error(out, _reference_block(module, x)) < 1e-5
    out.square().mean().backward()
    for name, parameter in module.named_parameters():
        assert parameter.grad is not None and parameter.grad.abs().sum() > 0, name


def test_window_attention_rank_follows_window():
    assert hnn.WindowAttention(8, 2, 7).rank == 2
    assert hnn.WindowAttention(8, 2, (2, 7, 7)).rank == 3
    assert hnn.WindowAttention(8, 2, 7).rpb.shape == (2, 13, 13)


def test_wrong_input_rank_is_named():
    with pytest.raises(ValueError, match=r"WindowAttention expects \[B, \*spatial, C\] with 2 spatial axes"):
        hnn.WindowAttention(8, 2, 3)(torch.randn(2, 9, 8))


def test_autocast_with_float32_rpb():
    module = hnn.WindowAttention(16, 2, 3, shift=1)
    x = torch.randn(1, 6, 6, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = module(x)
    assert out.dtype == torch.bfloat16
    out.float().sum().backward()
    assert module.rpb.grad is not None and module.rpb.grad.dtype == torch.float32


def test_swin_table_to_rpb_matches_swin_index():
    """Swin indexes its table by query minus key, row-major over (dy, dx); haloattn by key minus
    query: the converted table must give every (query, key) pair Swin's bias."""
    wh, ww, heads = 3, 4, 2
    table = torch.randn((2 * wh - 1) * (2 * ww - 1), heads)
    rpb = hnn.swin_table_to_rpb(table, (wh, ww))
    for (qy, qx), (ky, kx) in itertools.product(itertools.product(range(wh), range(ww)), repeat=2):
        swin = table[(qy - ky + wh - 1) * (2 * ww - 1) + (qx - kx + ww - 1)]
        ours = rpb[:, ky - qy + wh - 1, kx - qx + ww - 1]
        assert torch.equal(swin, ours)


def test_submodules_are_reached_from_the_package_alone():
    """``import haloattn`` then ``haloattn.nn.X`` (as ``torch.nn`` after ``import torch``), in a
    fresh interpreter where nothing imported the submodules before; unknown names still raise."""
    import subprocess
    import sys

    code = ("import sys, haloattn; assert 'haloattn.nn' not in sys.modules; "
            "haloattn.nn.NeighborhoodAttention2d(8, 2, 3); haloattn.integrations; haloattn.geometry.key_range\n"
            "try:\n    haloattn.no_such_thing\nexcept AttributeError as e:\n    print(e)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "no attribute 'no_such_thing'" in done.stdout


class _NattenStyleBlock(torch.nn.Module):
    """The parameters of NATTEN's NeighborhoodAttention{1,2,3}D (0.14-0.17, ``rel_pos_bias=True``;
    0.20+ without ``rpb``): ``qkv`` (dim -> 3 dim, channels as [3, heads, head_dim]), ``rpb``
    [heads, 2K-1 per axis] and ``proj``, with NATTEN's forward spelled out on the float64 oracle:
    the projection reshaped to [..., 3, heads, head_dim] and split on the 3, scale
    ``qk_scale or head_dim ** -0.5``, the bias added at key minus query + K - 1."""

    def __init__(self, dim, num_heads, kernel_size, dilation, qk_scale=None):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, dim // num_heads
        self.kernel_size, self.dilation, self.scale = kernel_size, dilation, qk_scale or self.head_dim ** -0.5
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.rpb = torch.nn.Parameter(torch.randn(num_heads, *(2 * k - 1 for k in kernel_size)))
        self.proj = torch.nn.Linear(dim, dim)

    def forward(self, x):
        x = x.double()
        qkv = torch.nn.functional.linear(x, self.qkv.weight.double(), self.qkv.bias.double())
        qkv = qkv.reshape(*x.shape[:-1], 3, self.num_heads, self.head_dim)
        q, k, v = (qkv.select(-3, i) for i in range(3))
        out, _ = oracle.attention(q, k, v, self.kernel_size, dilation=self.dilation, scale=self.scale,
                                  rpb=self.rpb.double())
        return torch.nn.functional.linear(out.flatten(-2), self.proj.weight.double(), self.proj.bias.double())


@pytest.mark.parametrize("module_type, kernel, dilation, spatial", [
    (hnn.NeighborhoodAttention1d, (5,), (2,), (13,)),
    (hnn.NeighborhoodAttention2d, (3, 5), (1, 2), (6, 11)),
    (hnn.NeighborhoodAttention3d, (3, 3, 2), (1, 1, 2), (4, 5, 6)),
], ids=["1d", "2d", "3d"])
def test_natten_checkpoints_load_as_they_are(module_type, kernel, dilation, spatial):
    """A NATTEN module's state_dict (qkv, rpb, proj) loads strictly into the haloattn block of the
    same rank and gives NATTEN's output (docs/migrating.md)."""
    torch.manual_seed(len(spatial))
    natten = _NattenStyleBlock(24, 3, kernel, dilation, qk_scale=0.3)
    block = module_type(24, 3, kernel, dilation=dilation, rpb=True, scale=0.3)
    block.load_state_dict(natten.state_dict(), strict=True)
    x = torch.randn(2, *spatial, 24)
    assert oracle.rel_error(block(x), natten(x)) < 1e-5
