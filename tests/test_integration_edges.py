"""The integration paths on the CPU, adversarially: torch.compile (dynamic shapes, recompiles,
gradients, grad modes, mods reading captured tensors), torch.export with dynamic dims,
torch.jit.trace, meta and fake tensors, FlopCounterMode, torch.func and autograd's own batched
paths, autocast, nn modules as objects (copies, pickles, dtypes), merge_attentions and calls from
several threads. Every result is checked against the float64 oracle (SEMANTICS.md section 7)."""

from __future__ import annotations

import copy
import io
import math
import pickle
import threading

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import haloattn
import haloattn.nn as hnn
from haloattn import flop_count, ops
from haloattn.problem import build_problem

import oracle

pytestmark = pytest.mark.usefixtures("plain_cpu_environment")

F64 = torch.float64
TOL = oracle.TOLERANCE[F64]


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


class CountingBackend:
    """A torch.compile backend that counts graphs and runs them eagerly."""

    def __init__(self):
        self.graphs = 0

    def __call__(self, gm, example_inputs):
        self.graphs += 1
        return gm.forward


def randn(gen, *shape, dtype=F64, requires_grad=False):
    return torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype).requires_grad_(requires_grad)


def qkv(gen, *shape, requires_grad=False):
    return tuple(randn(gen, *shape, requires_grad=requires_grad) for _ in range(3))


# ---------------------------------------------------------------------------------------------
# score_mod reading a captured tensor: compiled, fake and meta calls


TABLE = torch.randn(2, generator=torch.Generator().manual_seed(11), dtype=F64)


def add_table(score, b, h, q_idx, kv_idx):
    return score + TABLE[h] * (kv_idx - q_idx)


def test_compiled_score_mod_reading_a_captured_tensor():
    """The fake (under dynamo's FakeTensorMode) probes the score_mod; fake probe indices into the
    captured real table raised inside torch, so no such model compiled."""
    gen = torch.Generator().manual_seed(0)
    counter = CountingBackend()
    compiled = torch.compile(lambda q, k, v: haloattn.attention(q, k, v, 3, score_mod=add_table),
                             backend=counter, fullgraph=True)
    for _ in range(2):
        q, k, v = qkv(gen, 1, 9, 2, 4)
        ref, _ = oracle.attention(q, k, v, 3, score_mod=add_table)
        assert oracle.rel_error(compiled(q, k, v), ref) <= TOL
    assert counter.graphs == 1


def test_compiled_module_with_a_score_mod_made_at_init_trains():
    class Biased(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(4, 4, dtype=F64)
            table = torch.randn(2, generator=torch.Generator().manual_seed(3), dtype=F64)
            self.score_mod = lambda s, b, h, qi, ki: s - table[h].abs() * (ki - qi).abs()

        def forward(self, q, k, v):
            return self.proj(haloattn.attention(q, k, v, (3, 3), score_mod=self.score_mod))

    gen = torch.Generator().manual_seed(1)
    model = Biased()
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    q, k, v = qkv(gen, 1, 5, 6, 2, 4, requires_grad=True)
    grad = randn(gen, 1, 5, 6, 2, 4)
    out = compiled(q, k, v)
    grads = torch.autograd.grad(out, (q, k, v, model.proj.weight), grad)
    rq, rk, rv = (t.detach().requires_grad_() for t in (q, k, v))
    ref_attn, _ = oracle.attention(rq, rk, rv, (3, 3), score_mod=model.score_mod)
    ref = model.proj(ref_attn)
    ref_grads = torch.autograd.grad(ref, (rq, rk, rv, model.proj.weight), grad)
    assert oracle.rel_error(out, ref) <= TOL
    for g, r in zip(grads, ref_grads):
        assert oracle.rel_error(g, r) <= TOL


def test_fake_and_meta_calls_with_a_score_mod_reading_a_captured_tensor():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q = torch.randn(1, 8, 2, 4, dtype=F64)
        out, lse = haloattn.attention(q, q, q, 3, score_mod=add_table, return_lse=True)
    assert out.shape == (1, 8, 2, 4) and lse.shape == (1, 8, 2)
    q = torch.randn(1, 8, 2, 4, dtype=F64, device="meta")
    assert haloattn.attention(q, q, q, 3, score_mod=add_table).shape == (1, 8, 2, 4)
    # and the probe still refuses a score_mod that is not elementwise, on every path
    with FakeTensorMode(), pytest.raises(ValueError, match="must act elementwise"):
        q = torch.randn(1, 8, 2, 4, dtype=F64)
        haloattn.attention(q, q, q, 3, score_mod=lambda s, b, h, qi, ki: s + TABLE)
    with pytest.raises(ValueError, match="must act elementwise"):
        q = torch.randn(1, 8, 2, 4, dtype=F64, device="meta")
        haloattn.attention(q, q, q, 3, score_mod=lambda s, b, h, qi, ki: s + TABLE)


# ---------------------------------------------------------------------------------------------
# torch.compile: shapes, recompiles, gradients, grad modes


def test_dynamic_compile_one_graph_for_every_length_and_invalid_lengths_still_raise():
    gen = torch.Generator().manual_seed(2)
    counter = CountingBackend()
    compiled = torch.compile(lambda q, k, v: haloattn.attention(q, k, v, 3, dilation=2, causal=True),
                             backend=counter, fullgraph=True, dynamic=True)
    for length in (8, 9, 11, 14):
        q, k, v = qkv(gen, 2, length, 2, 4)
        ref, _ = oracle.attention(q, k, v, 3, dilation=2, causal=True)
        assert oracle.rel_error(compiled(q, k, v), ref) <= TOL
    assert counter.graphs == 1
    q, k, v = qkv(gen, 1, 5, 2, 4)  # window 3 x dilation 2 > 5
    with pytest.raises(Exception, match="exceeds the axis length"):
        compiled(q, k, v)


def test_automatic_dynamic_never_recompiles_for_a_seen_shape():
    gen = torch.Generator().manual_seed(3)
    counter = CountingBackend()
    compiled = torch.compile(lambda q, k, v: haloattn.attention(q, k, v, (3, 3)), backend=counter, fullgraph=True)
    shapes = ((1, 5, 6), (2, 5, 6), (2, 7, 6), (3, 9, 8))
    for shape in shapes + shapes:
        if shape == shapes[0]:
            graphs = counter.graphs
        q, k, v = qkv(gen, *shape, 2, 4)
        ref, _ = oracle.attention(q, k, v, (3, 3))
        assert oracle.rel_error(compiled(q, k, v), ref) <= TOL
    # one graph more for each axis seen to change (dynamo's automatic dynamic shapes, as for any
    # torch function), none for shapes seen before
    assert graphs <= 4 and counter.graphs == graphs


@pytest.mark.parametrize("make, shape", [
    (lambda: hnn.NeighborhoodAttention1d(8, 2, 5, causal=True, softcap=2.0, rpb=True, dtype=F64), (2, 9, 8)),
    (lambda: hnn.NeighborhoodAttention2d(8, 2, 3, dilation=(1, 2), rpb=True, dtype=F64), (2, 5, 7, 8)),
    (lambda: hnn.WindowAttention(8, 2, (3, 3), shift=(1, 2), dtype=F64), (1, 6, 7, 8)),
    (lambda: hnn.NeighborhoodAttention3d(8, 2, (2, 3, 3), stride=(1, 2, 1), dtype=F64), (1, 3, 4, 5, 8)),
], ids=["na1d", "na2d", "window", "na3d"])
def test_compiled_modules_train_and_run_under_no_grad_and_inference_mode(make, shape):
    torch.manual_seed(4)
    module = make()
    counter = CountingBackend()
    compiled = torch.compile(module, backend=counter, fullgraph=True)
    gen = torch.Generator().manual_seed(4)

    def step(fn, x, grad):
        module.zero_grad()
        x = x.detach().requires_grad_()
        out = fn(x)
        out.backward(grad)
        return [out.detach(), x.grad] + [p.grad.clone() for p in module.parameters()]

    for _ in range(2):  # the second step reuses the graph
        x, grad = randn(gen, *shape), randn(gen, *shape)
        for got, want in zip(step(compiled, x, grad), step(module, x, grad)):
            assert oracle.rel_error(got, want) <= TOL
    assert counter.graphs == 1
    with torch.no_grad():
        assert oracle.rel_error(compiled(x), module(x)) <= TOL
    with torch.inference_mode():
        assert oracle.rel_error(compiled(x), module(x)) <= TOL


def test_compiled_lse_extra_tokens_rpb_softcap_against_the_oracle():
    gen = torch.Generator().manual_seed(5)
    q, k, v = qkv(gen, 1, 6, 5, 4, 4, requires_grad=True)
    k2, v2 = (t.detach()[..., :2, :].clone().requires_grad_() for t in (k, v))  # GQA: 2 kv heads
    ak, av = randn(gen, 1, 3, 2, 4, requires_grad=True), randn(gen, 1, 3, 2, 4, requires_grad=True)
    rpb = randn(gen, 4, 5, 3, requires_grad=True)
    options = dict(rpb=rpb, softcap=3.0, additional_keys=ak, additional_values=av)
    compiled = torch.compile(lambda *a: haloattn.attention(*a[:3], (3, 2), return_lse=True, rpb=a[3], softcap=3.0,
                                                           additional_keys=a[4], additional_values=a[5]),
                             backend="aot_eager", fullgraph=True)
    leaves = (q, k2, v2, rpb, ak, av)
    out, lse = compiled(*leaves)
    ref_out, ref_lse = oracle.attention(q, k2, v2, (3, 2), **options)
    assert oracle.rel_error(out, ref_out) <= TOL
    assert (lse - ref_lse).abs().max() <= oracle.LSE_TOLERANCE[F64]
    w_out, w_lse = randn(gen, *out.shape), randn(gen, *lse.shape)
    grads = torch.autograd.grad((out * w_out).sum() + (lse * w_lse).sum(), leaves)
    ref = torch.autograd.grad((ref_out * w_out).sum() + (ref_lse * w_lse).sum(), leaves)
    for g, r in zip(grads, ref):
        assert oracle.rel_error(g, r) <= TOL


# ---------------------------------------------------------------------------------------------
# torch.export and torch.jit.trace


def test_export_with_dynamic_dims_runs_new_shapes_and_guards_the_window():
    torch.manual_seed(6)
    module = hnn.NeighborhoodAttention2d(8, 2, 3, rpb=True, dtype=F64).eval()
    gen = torch.Generator().manual_seed(6)
    batch, height, width = torch.export.Dim("B", max=8), torch.export.Dim("H", min=3, max=32), \
        torch.export.Dim("W", min=3, max=32)
    program = torch.export.export(module, (randn(gen, 2, 6, 7, 8),),
                                  dynamic_shapes={"x": {0: batch, 1: height, 2: width}})
    exported = program.module()
    for shape in ((1, 3, 3, 8), (3, 9, 5, 8)):
        x = randn(gen, *shape)
        assert oracle.rel_error(exported(x), module(x)) <= TOL
    with pytest.raises(Exception):  # a length below the window fails the program's guard
        exported(randn(gen, 1, 2, 5, 8))


def test_traced_window_attention_saves_loads_and_matches():
    torch.manual_seed(7)
    module = hnn.WindowAttention(8, 2, (3, 3), shift=(1, 1), dtype=F64)
    gen = torch.Generator().manual_seed(7)
    traced = torch.jit.trace(module, randn(gen, 2, 6, 7, 8))
    buffer = io.BytesIO()
    torch.jit.save(traced, buffer)
    buffer.seek(0)
    loaded = torch.jit.load(buffer)
    x = randn(gen, 2, 6, 7, 8)
    assert oracle.rel_error(loaded(x), module(x)) <= TOL


# ---------------------------------------------------------------------------------------------
# meta device, FlopCounterMode


def test_meta_model_counts_the_flop_count_formulas_forward_and_backward():
    with torch.device("meta"):
        module = hnn.NeighborhoodAttention2d(16, 2, (3, 5), dilation=(2, 1), rpb=True)
    x = torch.randn(2, 9, 11, 16, device="meta", requires_grad=True)
    with FlopCounterMode(display=False) as counter:
        out = module(x)
        out.sum().backward()
    assert out.device.type == "meta" and module.rpb.grad.shape == module.rpb.shape
    counts = counter.get_flop_counts()["Global"]
    problem = build_problem(torch.empty(2, 9, 11, 2, 8, device="meta"), torch.empty(2, 9, 11, 2, 8, device="meta"),
                            torch.empty(2, 9, 11, 2, 8, device="meta"), (3, 5), dilation=(2, 1))
    assert counts[torch.ops.haloattn.attention] == flop_count.forward_flops(problem)
    assert counts[torch.ops.haloattn.attention_backward] == flop_count.backward_flops(problem)
    # every query attends 3 x 5 keys here: 2 * (8 + 8) FLOPs a pair
    assert flop_count.forward_flops(problem) == 2 * 2 * 9 * 11 * 15 * 32


# ---------------------------------------------------------------------------------------------
# torch.func and autograd's own paths


def test_gradcheck_and_gradgradcheck_reference_float64():
    gen = torch.Generator().manual_seed(8)
    leaves = (*qkv(gen, 1, 5, 2, 3, requires_grad=True), randn(gen, 2, 5, requires_grad=True),
              randn(gen, 1, 2, 2, 3, requires_grad=True), randn(gen, 1, 2, 2, 3, requires_grad=True))

    def fn(q, k, v, rpb, ak, av):
        return haloattn.attention(q, k, v, 3, rpb=rpb, softcap=2.0, additional_keys=ak, additional_values=av,
                                  return_lse=True, backend="reference")

    assert torch.autograd.gradcheck(fn, leaves, check_forward_ad=True)
    assert torch.autograd.gradgradcheck(fn, leaves)


def test_legacy_batched_gradients_are_refused_clearly_and_torch_func_gives_them():
    """torch.autograd.grad(is_grads_batched=True) and autograd.functional.jacobian(vectorize=True)
    run torch's legacy vmap, which calls no vmap rule: the backward failed inside a backend with a
    vmap error asking for a torch bug report. It says what to use instead, which works."""
    gen = torch.Generator().manual_seed(9)
    q, k, v = qkv(gen, 1, 5, 1, 2, requires_grad=True)
    out = haloattn.attention(q, k, v, 3)
    with pytest.raises(NotImplementedError, match="legacy vmap.*torch.func"):
        torch.autograd.grad(out, q, randn(gen, 3, *out.shape), is_grads_batched=True)
    with pytest.raises(NotImplementedError, match="torch.func.jacrev"):
        torch.autograd.functional.jacobian(lambda q: haloattn.attention(q, k, v, 3), q, vectorize=True)
    ref = torch.autograd.functional.jacobian(lambda q: oracle.attention(q, k, v, 3)[0], q)
    for transform in (torch.func.jacrev, torch.func.jacfwd):
        assert oracle.rel_error(transform(lambda q: haloattn.attention(q, k, v, 3))(q), ref) <= TOL


def test_vmap_over_problems_matches_the_oracle_per_problem():
    gen = torch.Generator().manual_seed(10)
    q, k, v = qkv(gen, 3, 2, 7, 2, 4)
    rpb = randn(gen, 3, 2, 5)
    out = torch.func.vmap(lambda q, k, v, r: haloattn.attention(q, k, v, 3, rpb=r), in_dims=(2, 0, 0, 0))(
        q.movedim(0, 2), k, v, rpb)
    for i in range(3):
        ref, _ = oracle.attention(q[i], k[i], v[i], 3, rpb=rpb[i])
        assert oracle.rel_error(out[i], ref) <= TOL


def test_functional_call_and_per_sample_gradients_of_a_module():
    torch.manual_seed(12)
    module = hnn.NeighborhoodAttention1d(8, 2, 3, rpb=True, dtype=F64)
    gen = torch.Generator().manual_seed(12)
    params = {n: randn(gen, *p.shape) for n, p in module.named_parameters()}
    x = randn(gen, 3, 7, 8)

    def loss(p, xi):
        return torch.func.functional_call(module, p, (xi.unsqueeze(0),)).pow(2).sum()

    per_sample = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0))(params, x)
    reference = copy.deepcopy(module)
    with torch.no_grad():
        for n, p in reference.named_parameters():
            p.copy_(params[n])
    for i in range(3):
        reference.zero_grad()
        reference(x[i:i + 1]).pow(2).sum().backward()
        for n, p in reference.named_parameters():
            assert oracle.rel_error(per_sample[n][i], p.grad) <= TOL


# ---------------------------------------------------------------------------------------------
# autocast, nn modules as objects


def test_autocast_bfloat16_dtypes_and_gradients():
    torch.manual_seed(13)
    module = hnn.NeighborhoodAttention2d(16, 2, 3, rpb=True)
    gen = torch.Generator().manual_seed(13)
    x = randn(gen, 2, 5, 6, 16, dtype=torch.float32, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = module(x)
    assert out.dtype == torch.bfloat16 and module.rpb.dtype == torch.float32
    out.float().pow(2).sum().backward()
    assert x.grad.dtype == torch.float32 and module.rpb.grad.dtype == torch.float32
    q, k, v = (randn(gen, 1, 8, 2, 4, dtype=torch.float32) for _ in range(3))
    rpb = randn(gen, 2, 5, dtype=torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        o, lse = haloattn.attention(q, k, v, 3, rpb=rpb, return_lse=True)
    assert o.dtype == torch.bfloat16 and lse.dtype == torch.float32
    ref, _ = oracle.attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), 3, rpb=rpb)
    assert oracle.rel_error(o, ref) <= oracle.TOLERANCE[torch.bfloat16]


def test_module_copies_pickles_state_dicts_and_dtypes():
    torch.manual_seed(14)
    module = hnn.WindowAttention(8, 2, (3, 3), shift=(1, 1))
    gen = torch.Generator().manual_seed(14)
    x = randn(gen, 2, 6, 7, 8, dtype=torch.float32)
    expected = module(x)
    buffer = io.BytesIO()
    torch.save(module.state_dict(), buffer)
    buffer.seek(0)
    fresh = hnn.WindowAttention(8, 2, (3, 3), shift=(1, 1))
    fresh.load_state_dict(torch.load(buffer))  # weights_only
    for other in (copy.deepcopy(module), pickle.loads(pickle.dumps(module)), fresh):
        assert torch.equal(other(x), expected)
    assert "window=(3, 3), shift=(1, 1), rpb=True" in repr(module)
    for dtype, convert in ((torch.float16, lambda m: m.half()), (torch.bfloat16, lambda m: m.to(torch.bfloat16)),
                           (F64, lambda m: m.double())):
        converted = convert(copy.deepcopy(module))
        assert converted.rpb.dtype == dtype
        out = converted(x.to(dtype))
        assert out.dtype == dtype
        assert oracle.rel_error(out, converted.double()(x.double())) <= 10 * oracle.TOLERANCE[dtype]


# ---------------------------------------------------------------------------------------------
# merge_attentions


def _parts(gen, dtype=F64, requires_grad=False):
    return ([randn(gen, 2, 5, 2, 4, dtype=dtype, requires_grad=requires_grad) for _ in range(3)],
            [randn(gen, 2, 5, 2, dtype=dtype, requires_grad=requires_grad) for _ in range(3)])


def test_merge_attentions_dtype_does_not_depend_on_the_order():
    """The result's dtype was outputs[0]'s: float32 first gave a float32 merge of float64 parts."""
    outs, lses = _parts(torch.Generator().manual_seed(15))
    mixed_first = haloattn.merge_attentions([outs[0].float(), outs[1]], [lses[0].float(), lses[1]])
    mixed_last = haloattn.merge_attentions([outs[1], outs[0].float()], [lses[1], lses[0].float()])
    assert mixed_first[0].dtype == mixed_last[0].dtype == F64
    torch.testing.assert_close(mixed_first[0], mixed_last[0], rtol=0, atol=0)
    bf16 = haloattn.merge_attentions([o.bfloat16() for o in outs], [l.float() for l in lses])
    assert bf16[0].dtype == torch.bfloat16 and bf16[1].dtype == torch.float32


def test_merge_attentions_names_bad_parts():
    outs, lses = _parts(torch.Generator().manual_seed(16))
    with pytest.raises(TypeError, match=r"outputs\[1\] must be a floating torch.Tensor, got int"):
        haloattn.merge_attentions([outs[0], 3], lses[:2])
    with pytest.raises(TypeError, match=r"lses\[0\] must be a floating"):
        haloattn.merge_attentions(outs[:2], [lses[0].long(), lses[1]])
    with pytest.raises(ValueError, match=r"outputs\[1\] is on meta"):
        haloattn.merge_attentions([outs[0], outs[1].to("meta")], [lses[0], lses[1].to("meta")])
    with pytest.raises(ValueError, match=r"outputs\[1\] has shape"):
        haloattn.merge_attentions([outs[0], outs[1][:, :4]], [lses[0], lses[1][:, :4]])


def test_merge_attentions_matches_one_call_and_handles_empty_rows():
    gen = torch.Generator().manual_seed(17)
    q, k, v = qkv(gen, 1, 8, 2, 4, requires_grad=True)
    ak, av = randn(gen, 1, 3, 2, 4, requires_grad=True), randn(gen, 1, 3, 2, 4, requires_grad=True)
    local, local_lse = haloattn.attention(q, k, v, 3, return_lse=True)
    scores = torch.einsum("bnhd,behd->bnhe", q, ak) * 0.5
    extra, extra_lse = torch.einsum("bnhe,behd->bnhd", scores.softmax(-1), av), scores.logsumexp(-1)
    out, lse = haloattn.merge_attentions([local, extra], [local_lse, extra_lse])
    ref, ref_lse = oracle.attention(q, k, v, 3, additional_keys=ak, additional_values=av)
    assert oracle.rel_error(out, ref) <= TOL and (lse - ref_lse).abs().max() <= 1e-10
    w = randn(gen, *out.shape)
    leaves = (q, k, v, ak, av)
    for g, r in zip(torch.autograd.grad((out * w).sum() + lse.sum(), leaves),
                    torch.autograd.grad((ref * w).sum() + ref_lse.sum(), leaves)):
        assert oracle.rel_error(g, r) <= TOL
    # rows no part saw: output 0, lse -inf, finite zero gradients; rows one part saw: that part
    outs, lses = _parts(gen, requires_grad=True)
    dead = [l.detach().clone() for l in lses]
    for l in dead:
        l[0, 0, 0] = -math.inf
    dead[0][1, 1, 1] = dead[1][1, 1, 1] = -math.inf
    dead = [l.requires_grad_() for l in dead]
    out, lse = haloattn.merge_attentions(outs, dead)
    assert torch.all(out[0, 0, 0] == 0) and lse[0, 0, 0] == -math.inf
    torch.testing.assert_close(out[1, 1, 1], outs[2][1, 1, 1], rtol=0, atol=0)
    (out.sum() + lse[torch.isfinite(lse)].sum()).backward()
    assert all(torch.isfinite(t.grad).all() for t in (*outs, *dead))
    outs, lses = _parts(gen, requires_grad=True)
    assert torch.autograd.gradcheck(lambda *t: haloattn.merge_attentions(t[:3], t[3:]), (*outs, *lses))


# ---------------------------------------------------------------------------------------------
# threads


def test_spec_keys_of_concurrent_calls_with_mods_stay_apart(monkeypatch):
    """The key of a spec with mods was f"spec{len(_SPECS)}": two threads registering at once both
    took the same number, and the later one's mods replaced the earlier's. Forced here: each
    thread waits for the other once it has read the count."""
    barrier = threading.Barrier(2, timeout=5)

    class WaitingDict(dict):
        def __len__(self):
            try:
                barrier.wait()
            except threading.BrokenBarrierError:
                pass
            return super().__len__()

    monkeypatch.setattr(ops, "_SPECS", WaitingDict(ops._SPECS))
    mods = [lambda b, h, qi, ki: ki <= qi, lambda b, h, qi, ki: ki >= qi]
    keys = [None, None]

    def register(i):
        options = dict(window=3, mask_mod=mods[i])
        keys[i] = ops.spec_key((tuple(options), tuple(options.values())))

    threads = [threading.Thread(target=register, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert keys[0] != keys[1]
    assert [ops._options(key)["mask_mod"] for key in keys] == mods


def test_calls_from_several_threads_match_the_oracle():
    """The call, spec and plan caches filled from eight threads at once (eager calls, calls a
    FlopCounterMode watches, which take the custom op, and backward passes)."""
    haloattn.clear_caches()
    cases = []
    for i in range(12):
        options = dict(window=3 + i % 2, causal=i % 3 == 0, dilation=1 + (i % 4 == 0))
        if i % 4 == 1:
            options["softcap"] = 2.0 + i
        if i % 5 == 2:
            options["mask_mod"] = (lambda j: lambda b, h, qi, ki: (ki + j) % 3 != 0)(i)
        cases.append((7 + i % 4, options))
    failures = []

    def worker(seed):
        gen = torch.Generator().manual_seed(seed)
        for rep in range(6):
            length, options = cases[(seed * 5 + rep) % len(cases)]
            q, k, v = qkv(gen, 1, length, 2, 4)
            try:
                if rep % 3 == 0:
                    out = haloattn.attention(q, k, v, **options)
                    grads = ()
                elif rep % 3 == 1:
                    with FlopCounterMode(display=False):
                        out = haloattn.attention(q, k, v, **options)
                    grads = ()
                else:
                    q.requires_grad_()
                    out = haloattn.attention(q, k, v, **options)
                    grads = torch.autograd.grad(out.sum(), q)
                rq = q.detach().requires_grad_()
                ref, _ = oracle.attention(rq, k, v, **options)
                errors = [oracle.rel_error(out, ref)]
                if grads:
                    errors.append(oracle.rel_error(grads[0], torch.autograd.grad(ref.sum(), rq)[0]))
                if max(errors) > TOL:
                    failures.append((seed, rep, options, errors))
            except Exception as error:  # noqa: BLE001 (reported below)
                failures.append((seed, rep, options, repr(error)))

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures[:3]


def test_score_mod_gradients_through_the_custom_op_under_a_flop_counter():
    """The custom op's backward runs with autograd's dispatch keys excluded: the reference's
    score_mod recomputation under torch.enable_grad() recorded no graph, and its gradient raised
    (in compiled training too, test_compiled_module_with_a_score_mod_made_at_init_trains)."""
    gen = torch.Generator().manual_seed(18)
    q, k, v = qkv(gen, 1, 9, 2, 4, requires_grad=True)
    with FlopCounterMode(display=False) as counter:
        out = haloattn.attention(q, k, v, 3, score_mod=add_table, softcap=2.0)
        grads = torch.autograd.grad(out, (q, k, v), w := randn(gen, *out.shape))
    assert counter.get_flop_counts()["Global"][torch.ops.haloattn.attention_backward] > 0
    ref, _ = oracle.attention(q, k, v, 3, score_mod=add_table, softcap=2.0)
    for g, r in zip(grads, torch.autograd.grad(ref, (q, k, v), w)):
        assert oracle.rel_error(g, r) <= TOL
