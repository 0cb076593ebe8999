"""torch.compile: a module that calls haloattn.attention compiles with fullgraph=True, does not
recompile on repeated calls with the same shapes, and gives the eager outputs and gradients."""

from __future__ import annotations


import os

import pytest
import torch

import haloattn


pytestmark = pytest.mark.usefixtures("plain_cpu_environment")


class Block(torch.nn.Module):
    def __init__(self, dim=8, heads=2, window=(3, 3), rank=2, return_lse=False, **options):
        super().__init__()
        self.heads, self.window, self.options, self.return_lse = heads, window, options, return_lse
        self.qkv = torch.nn.Linear(dim, 3 * dim, dtype=torch.float64)
        self.proj = torch.nn.Linear(dim, dim, dtype=torch.float64)
        K = window if isinstance(window, tuple) else (window,) * rank
        self.rpb = torch.nn.Parameter(0.1 * torch.randn(heads, *(2 * k - 1 for k in K), dtype=torch.float64))

    def forward(self, x):
        *lead, C = x.shape
        q, k, v = self.qkv(x).reshape(*lead, 3, self.heads, C // self.heads).unbind(-3)
        res = haloattn.attention(q, k, v, self.window, rpb=self.rpb, return_lse=self.return_lse, **self.options)
        if self.return_lse:
            out, lse = res
            return self.proj(out.reshape(*lead, C)) + lse.sum(-1, keepdim=True)
        return self.proj(res.reshape(*lead, C))


class CountingBackend:
    """A torch.compile backend that counts graph compilations and runs the graph eagerly."""

    def __init__(self):
        self.graphs = 0
        self.targets = set()

    def __call__(self, gm, example_inputs):
        self.graphs += 1
        self.targets |= {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}
        return gm.forward

    @property
    def has_haloattn_op(self):
        return any("haloattn.attention" in t for t in self.targets)


def mask_even(b, h, q_idx, kv_idx):
    return (kv_idx % 2 == 0) | (q_idx == kv_idx)


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("options", [
    dict(),
    dict(causal=(True, False), dilation=(1, 2), stride=(2, 1)),
    dict(pattern="window", shift=(1, 2), mask_mod=mask_even),
], ids=["plain", "causal_dilated_strided", "window_shift_mask_mod"])
def test_fullgraph_no_recompile_same_as_eager(options):
    torch.manual_seed(0)
    model = Block(**options)
    counter = CountingBackend()
    compiled = torch.compile(model, backend=counter, fullgraph=True)
    x = torch.randn(2, 6, 7, 8, dtype=torch.float64)
    expected = model(x)
    for _ in range(3):
        out = compiled(torch.randn_like(x))
    out = compiled(x)
    assert counter.graphs == 1
    assert counter.has_haloattn_op  # traced as the custom op, not inlined or broken
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
    # a new shape is allowed to compile once more, but then stays put
    y = torch.randn(1, 8, 8, 8, dtype=torch.float64)
    compiled(y)
    compiled(torch.randn_like(y))
    assert counter.graphs <= 2
    torch.testing.assert_close(compiled(y), model(y), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("return_lse", [False, True])
def test_compiled_gradients_equal_eager_aot_eager(return_lse):
    torch.manual_seed(1)
    model = Block(return_lse=return_lse, causal=(False, True))
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    x = torch.randn(2, 5, 6, 8, dtype=torch.float64, requires_grad=True)
    seed = torch.randn(2, 5, 6, 8, dtype=torch.float64)

    def grads(fn):
        model.zero_grad()
        x.grad = None
        out = fn(x)
        (out * seed).sum().backward()
        return out.detach(), [x.grad.clone()] + [p.grad.clone() for p in model.parameters()]

    out_e, g_e = grads(model)
    out_c, g_c = grads(compiled)
    torch.testing.assert_close(out_c, out_e, rtol=1e-12, atol=1e-12)
    assert len(g_c) == 6  # x, qkv weight/bias, proj weight/bias, rpb
    for a, b in zip(g_c, g_e):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    assert g_c[-1].abs().sum() > 0  # rpb received a gradient through the custom op
    # repeated training steps do not recompile
    before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    for _ in range(2):
        grads(compiled)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == before


def test_compile_1d_extra_tokens_kq_conv_gradients():
    torch.manual_seed(2)
    q, k, v = (torch.randn(1, 10, 2, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    ak, av = (torch.randn(1, 2, 2, 4, dtype=torch.float64, requires_grad=True) for _ in range(2))
    w = torch.randn(2, 2, 3, dtype=torch.float64, requires_grad=True)

    def fn(q, k, v, ak, av, w):
        out, lse = haloattn.attention(q, k, v, 5, kq_conv=w, additional_keys=ak, additional_values=av,
                                      softcap=3.0, return_lse=True)
        return out.sum(-1) + lse

    counter = CountingBackend()
    compiled = torch.compile(fn, backend=counter, fullgraph=True)
    args = (q, k, v, ak, av, w)
    eager = fn(*args)
    ge = torch.autograd.grad(eager.sum(), args)
    comp = compiled(*args)
    gc = torch.autograd.grad(comp.sum(), args)
    torch.testing.assert_close(comp, eager, rtol=1e-12, atol=1e-12)
    for a, b in zip(gc, ge):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    compiled(*args)
    assert counter.graphs == 1 and counter.has_haloattn_op


def test_compile_validates_arguments():
    q = torch.randn(1, 8, 2, 4)

    @torch.compile(backend="eager", fullgraph=True)
    def bad(q):
        return haloattn.attention(q, q, q, 3, stride=5)

    with pytest.raises(Exception, match="stride on axis 0 is 5"):
        bad(q)


def test_compile_inductor_default_backend():
    torch.manual_seed(3)
    model = Block(dim=8, heads=2, window=3, rank=1).float()
    compiled = torch.compile(model, fullgraph=True)
    x = torch.randn(2, 12, 8)
    torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)
    before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    compiled(torch.randn_like(x))
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == before


def test_backward_op_returns_the_layouts_its_fake_promises():
    """Inductor checks a custom op's outputs against the strides of its fake: the backward's fake
    gives each gradient ``empty_like(input)``'s layout, so the real op must too, also for a
    transposed rpb table (a compiled timm Swin hands the backend one) whose gradient the window
    backend computes contiguous."""
    from haloattn import api, ops

    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 6, 6, 2, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    rpb = torch.randn(5, 5, 2, generator=gen, dtype=torch.float64).permute(2, 0, 1)  # [H, 5, 5], transposed
    options = dict(zip(api._OPTION_NAMES, ((3, 3), 1, 1, False, "window", (1, 1), None, None, None, None, False, None)))
    key = ops.spec_key((tuple(options), tuple(options.values())))
    tensors = (q, k, v, rpb, None, None, None)
    out, lse = torch.ops.haloattn.attention(*tensors, key)
    needs = [True, True, True, True, False, False, False]
    grads = torch.ops.haloattn.attention_backward(torch.randn_like(out), None, *tensors, out, lse, key, needs)
    for grad, like in zip(grads, (q, k, v, rpb)):
        assert grad.stride() == torch.empty_like(like).stride()
    # and the helper on its own: a contiguous gradient of a transposed table is re-laid out, values kept
    contiguous = torch.randn(2, 5, 5, dtype=torch.float64)
    laid_out = ops._laid_out_like_fake(contiguous, rpb)
    assert laid_out.stride() == rpb.stride() and torch.equal(laid_out, contiguous)


def test_exported_program_runs_in_another_process(tmp_path):
    """Without mods the custom op's spec is its options as JSON, so a program from torch.export,
    saved and loaded by a fresh process, runs there and gives this process's output; a spec with
    a mask_mod is a key of this process only, which another process names in its error."""
    import subprocess
    import sys

    from haloattn import api, ops

    torch.manual_seed(0)
    model = Block(window=(3, 5), dilation=(1, 2), causal=(True, False)).eval()
    x = torch.randn(2, 7, 12, 8, dtype=torch.float64)
    program = torch.export.export(model, (x,))
    torch.export.save(program, tmp_path / "block.pt2")
    torch.save((x, model(x)), tmp_path / "expected.pt")
    script = (
        "import sys, torch, haloattn\n"
        "program = torch.export.load(sys.argv[1] + '/block.pt2')\n"
        "x, expected = torch.load(sys.argv[1] + '/expected.pt')\n"
        "torch.testing.assert_close(program.module()(x), expected, rtol=0, atol=0)\n"
        "from haloattn import ops\n"
        "try:\n"
        "    ops._options(sys.argv[2])\n"
        "except KeyError as e:\n"
        "    print('mods spec:', e)\n"
    )
    options = dict(zip(api._OPTION_NAMES, (3, 1, 1, False, "neighborhood", 0, None, None, None, mask_even, False, None)))
    with_mods = ops.spec_key((tuple(options), tuple(options.values())))
    assert not with_mods.startswith("{")
    run = subprocess.run([sys.executable, "-c", script, str(tmp_path), with_mods], capture_output=True, text=True,
                         timeout=240, env={**os.environ, "HALOATTN_BACKEND": "reference"})
    assert run.returncode == 0, run.stderr[-2000:]
    assert "names call options of another process" in run.stdout
