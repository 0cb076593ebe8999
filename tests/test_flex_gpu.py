"""The flex backend compiled on a GPU: random problems with score_mod / mask_mod and every other
feature, against the reference backend in float64 (itself checked against the oracle in
test_reference_oracle.py). Grids span several 128-token tiles with ragged edges, so partial, full
and padded blocks all occur. Run with ``pytest -m gpu``.
"""

import math
import random
import warnings

import pytest
import torch

import haloattn
import oracle

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

TOLERANCE = {torch.float32: 1e-4, torch.float16: 4e-3, torch.bfloat16: 2e-2}


def score_alibi(score, b, h, q_idx, kv_idx):
    return score - (h + 1) * 0.02 * (q_idx - kv_idx).abs()


def score_tanh_gate(score, b, h, q_idx, kv_idx):
    return score * (1.0 + 0.5 * torch.tanh(score)) - 0.1 * b


def mask_checker(b, h, q_idx, kv_idx):
    return ((q_idx + kv_idx + h) % 5) != 0


def mask_kv_prefix(b, h, q_idx, kv_idx):
    return kv_idx >= (q_idx % 7)


SCORE_MODS = (None, score_alibi, score_tanh_gate)
MASK_MODS = (None, mask_checker, mask_kv_prefix)


def random_problem(rng: random.Random) -> dict:
    rank = rng.choice((1, 2, 2, 3))
    pattern = "window" if rng.random() < 0.25 else "neighborhood"
    low, high = {1: (100, 1500), 2: (9, 45), 3: (4, 14)}[rank]
    spatial, window, dilation, stride, causal, shift = [], [], [], [], [], []
    for _ in range(rank):
        L = rng.randint(low, high)
        Dl = rng.choice((1, 1, 2, 3)) if L >= 6 else 1
        K = rng.randint(1 if pattern == "window" else 2, max(2, min(L // Dl, {1: 300, 2: 21, 3: 9}[rank])))
        spatial.append(L)
        window.append(K)
        dilation.append(Dl)
        stride.append(rng.randint(1, K) if pattern == "neighborhood" and rng.random() < 0.3 else 1)
        causal.append(rng.random() < 0.3)
        shift.append(rng.randint(0, K - 1) if pattern == "window" and rng.random() < 0.6 else 0)
    heads = rng.choice((1, 2, 4, 6))
    head_dim = rng.choice((16, 32, 64, 64, 128))
    return dict(
        spatial=tuple(spatial), window=tuple(window), dilation=tuple(dilation), causal=tuple(causal),
        stride=tuple(stride), shift=tuple(shift), pattern=pattern, heads=heads,
        kv_heads=rng.choice([h for h in range(1, heads + 1) if heads % h == 0]),
        head_dim=head_dim, value_dim=rng.choice((head_dim, head_dim, 32)),
        dtype=rng.choice((torch.bfloat16, torch.float16, torch.float32)), batch=rng.choice((1, 2)),
        rpb=rng.random() < 0.4, extra=rng.choice((0, 0, 3, 17)), softcap=rng.choice((None, None, 8.0)),
        score_mod=rng.choice(SCORE_MODS), mask_mod=rng.choice(MASK_MODS),
    )


def run_case(p: dict, seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, device="cuda", generator=g, dtype=torch.float64)

    B, H, Hkv = p["batch"], p["heads"], p["kv_heads"]
    base = dict(query=rnd(B, *p["spatial"], H, p["head_dim"]), key=rnd(B, *p["spatial"], Hkv, p["head_dim"]),
                value=rnd(B, *p["spatial"], Hkv, p["value_dim"]))
    kw = dict(window=p["window"], dilation=p["dilation"], causal=p["causal"], stride=p["stride"], shift=p["shift"],
              pattern=p["pattern"], softcap=p["softcap"], score_mod=p["score_mod"], mask_mod=p["mask_mod"])
    if p["rpb"]:
        base["rpb"] = rnd(H, *(2 * k - 1 for k in p["window"]))
    if p["extra"]:
        base["additional_keys"] = rnd(B, p["extra"], Hkv, p["head_dim"])
        base["additional_values"] = rnd(B, p["extra"], Hkv, p["value_dim"])
    low = {n: t.to(p["dtype"]).requires_grad_() for n, t in base.items()}
    exact = {n: t.to(p["dtype"]).double().requires_grad_() for n, t in base.items()}

    def call(tensors, backend):
        named = dict(tensors)
        q, k, v = named.pop("query"), named.pop("key"), named.pop("value")
        return haloattn.attention(q, k, v, return_lse=True, backend=backend, **named, **kw)

    out, lse = call(low, "flex")
    ref_out, ref_lse = call(exact, "reference")
    tol = TOLERANCE[p["dtype"]]
    assert oracle.rel_error(out, ref_out) <= tol, ("output", p)
    finite = torch.isfinite(ref_lse)
    assert torch.equal(finite, torch.isfinite(lse)), ("empty rows", p)
    lse_err = (lse.double() - ref_lse)[finite].abs().max().item() if finite.any() else 0.0
    assert lse_err <= (2e-2 if p["dtype"] != torch.float32 else 1e-3) * max(1.0, ref_lse[finite].abs().max().item()), p
    go = torch.randn(out.shape, device="cuda", generator=g, dtype=torch.float64)
    gl = torch.randn(lse.shape, device="cuda", generator=g, dtype=torch.float64)

    def loss(o, l):
        return (o.double() * go).sum() + (torch.where(finite, l.double(), 0.0) * gl).sum()

    grads = torch.autograd.grad(loss(out, lse), list(low.values()))
    ref_grads = torch.autograd.grad(loss(ref_out, ref_lse), list(exact.values()))
    for name, a, b in zip(low, grads, ref_grads):
        assert torch.isfinite(a).all(), (name, p)
        # rpb entries sum score gradients that cancel; see test_flex_backend.py
        assert oracle.rel_error(a, b) <= tol * (10 if name == "rpb" else 4), (name, oracle.rel_error(a, b), p)


@pytest.mark.parametrize("seed", range(16))
def test_random_problems_with_mods(seed):
    p = random_problem(random.Random(1000 + seed))
    torch.cuda.synchronize()
    run_case(p, seed)


def score_erf(score, b, h, q_idx, kv_idx):
    return score + torch.erf(score) - 0.01 * (q_idx - kv_idx).abs()


@pytest.mark.parametrize("mod,fused_by", [(score_alibi, "triton"), (score_erf, "flex")])
def test_dispatcher_runs_mods_fused_without_a_slow_path_warning(mod, fused_by):
    """Mods run fused: compiled into backend triton's kernels where it can (ALiBi), on flex where
    it cannot (erf has no translation), never on the reference."""
    q, k, v = (torch.randn(1, 40, 40, 4, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    assert haloattn.explain(q, k, v, 9, score_mod=mod, verbose=False).chosen == fused_by
    with warnings.catch_warnings():
        warnings.simplefilter("error", haloattn.SlowPathWarning)
        out = haloattn.attention(q, k, v, 9, score_mod=mod)
    ref = haloattn.attention(q.double(), k.double(), v.double(), 9, score_mod=mod, backend="reference")
    assert oracle.rel_error(out, ref) <= TOLERANCE[torch.bfloat16]


def test_many_shapes_never_fall_back_to_unfused_flex():
    """More distinct problems than torch's default recompile limit (8) run in one process; the
    backend raises the limit and fails loudly beyond it instead of silently running Flex's
    unfused N x N path (tests/test_flex_backend.py checks the limits it sets)."""
    for n in range(10):
        q = torch.randn(1, 130 + 7 * n, 2, 32, device="cuda", dtype=torch.float16)
        out = haloattn.attention(q, q, q, 5 + n, mask_mod=mask_checker, backend="flex")
        ref = haloattn.attention(q.double(), q.double(), q.double(), 5 + n, mask_mod=mask_checker, backend="reference")
        assert oracle.rel_error(out, ref) <= TOLERANCE[torch.float16]


def test_inside_a_compiled_model():
    """A model compiled with fullgraph=True calls the flex backend through haloattn's custom ops
    (forward, then the backward op, which recomputes); gradients match eager calls, which keep
    the forward's Flex graph instead."""
    q, k, v = (torch.randn(2, 24, 20, 4, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    rpb = torch.randn(4, 13, 9, device="cuda", requires_grad=True)

    def step(fn):
        out = fn(q, k, v, (7, 5), rpb=rpb, score_mod=score_alibi, mask_mod=mask_checker, backend="flex")
        return torch.autograd.grad((out.float() ** 2).sum(), (q, k, v, rpb))

    eager = step(haloattn.attention)
    compiled = step(torch.compile(haloattn.attention, fullgraph=True))
    for a, b in zip(eager, compiled):
        assert oracle.rel_error(b, a) <= TOLERANCE[torch.bfloat16]
