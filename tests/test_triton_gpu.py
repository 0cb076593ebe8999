"""Backend ``triton`` (neighbourhood kernels) on a CUDA GPU, against the float64 oracle.

Random problems across ranks, per-axis window / stride / dilation / causal, both patterns, GQA,
D_v != D, rpb, softcap, additional tokens, LSE gradients and the three dtypes; bitwise-repeatable
backward; a problem with more than 2^31 elements in q (int64 offsets). Run with ``pytest -m gpu``.

``check_against_oracle`` is shared with the CPU interpreter tests (test_triton_neighborhood.py);
this module has no import-time side effects, so importing it never changes how Triton runs.
"""

import math
import random

import pytest
import torch

import haloattn
import oracle
from large_offsets import check_past_int32_offsets

BACKEND = "triton"


def _per_axis(value, rank):
    return tuple(value) if isinstance(value, (tuple, list)) else (value,) * rank


def check_against_oracle(spatial, window, *, dtype=torch.float32, device="cpu", heads=2, kv_heads=None,
                         head_dim=16, value_dim=None, batch=1, rpb=False, extra=0, grad_lse=True,
                         sum_loss=False, seed=0, **options):
    """Fresh random inputs -> backend ``triton`` and the oracle; compare out, LSE and every gradient.
    ``sum_loss``: the loss is ``out.sum() + lse.sum()``, whose gradients reach the backward as
    expanded tensors (every stride 0), not the random weights of the default loss."""
    kv_heads = kv_heads or heads
    value_dim = value_dim or head_dim
    gen = torch.Generator().manual_seed(seed)

    def leaf(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to(dtype).to(device).requires_grad_(True)

    q = leaf(batch, *spatial, heads, head_dim)
    k = leaf(batch, *spatial, kv_heads, head_dim)
    v = leaf(batch, *spatial, kv_heads, value_dim)
    leaves = {"query": q, "key": k, "value": v}
    kwargs = dict(options)
    if rpb:
        shape = (heads,) + tuple(2 * w - 1 for w in _per_axis(window, len(spatial)))
        kwargs["rpb"] = leaves["rpb"] = leaf(*shape, scale=0.5)
    if extra:
        kwargs["additional_keys"] = leaves["additional_keys"] = leaf(batch, extra, kv_heads, head_dim)
        kwargs["additional_values"] = leaves["additional_values"] = leaf(batch, extra, kv_heads, value_dim)

    out, lse = haloattn.attention(q, k, v, window, return_lse=True, backend=BACKEND, **kwargs)
    grad_out = torch.randn(out.shape, generator=gen).to(dtype).to(device)
    grad_lse_in = torch.randn(lse.shape, generator=gen).to(device) if grad_lse else torch.zeros_like(lse)
    if sum_loss:
        grad_out, grad_lse_in = torch.ones_like(out), torch.ones_like(lse)
        loss = out.sum() + lse.sum()
    else:
        loss = (out.float() * grad_out.float()).sum() + (lse * grad_lse_in).sum()
    names = list(leaves)
    grads = torch.autograd.grad(loss, [leaves[n] for n in names])

    ref = {n: t.detach().cpu().double().requires_grad_(True) for n, t in leaves.items()}
    ref_kwargs = {n: ref[n] for n in ("rpb", "additional_keys", "additional_values") if n in ref}
    ref_out, ref_lse = oracle.attention(ref["query"], ref["key"], ref["value"], window, **options, **ref_kwargs)
    ref_grads = torch.autograd.grad((ref_out * grad_out.cpu().double()).sum()
                                    + (ref_lse * grad_lse_in.cpu().double()).sum(), [ref[n] for n in names])

    tol, lse_tol = oracle.TOLERANCE[dtype], oracle.LSE_TOLERANCE[dtype]
    if dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32 and device != "cpu":
        # tf32 keeps 10 mantissa bits like float16: SEMANTICS 7 gives tf32 3e-3, and its LSE
        # error is that of 16-bit inputs.
        tol, lse_tol = 3e-3, oracle.LSE_TOLERANCE[torch.float16]
    errors = {"out": oracle.rel_error(out.cpu(), ref_out)}
    for n, g, rg in zip(names, grads, ref_grads):
        errors["d" + n] = oracle.rel_error(g.cpu(), rg)
    bad = {n: e for n, e in errors.items() if not e <= tol}
    lse_err = (lse.cpu().double() - ref_lse).abs().max().item()
    assert not bad, f"relative errors above {tol}: {bad} (all: {errors})"
    assert lse_err <= lse_tol, f"lse max abs error {lse_err}"
    return errors


def random_problem(rng: random.Random):
    """A random small problem touching every per-axis option and feature."""
    rank = rng.choice((1, 2, 3))
    pattern = rng.choice(("neighborhood", "neighborhood", "window"))
    limits = {1: 40, 2: 12, 3: 7}[rank]
    spatial, window, stride, dilation, causal, shift = [], [], [], [], [], []
    for _ in range(rank):
        L = rng.randint(3, limits)
        Dl = rng.choice((1, 1, 2))
        Dl = Dl if 2 * Dl <= L else 1
        K = rng.randint(1 if pattern == "window" else 2, max(2, L // Dl))
        spatial.append(L)
        window.append(K)
        dilation.append(Dl)
        stride.append(rng.randint(1, K) if pattern == "neighborhood" else 1)
        causal.append(rng.random() < 0.3)
        shift.append(rng.randint(0, K - 1) if pattern == "window" else 0)
    heads = rng.choice((1, 2, 4))
    options = dict(
        spatial=tuple(spatial), window=tuple(window), dilation=tuple(dilation), causal=tuple(causal),
        pattern=pattern, heads=heads, kv_heads=rng.choice([h for h in (1, 2, 4) if heads % h == 0]),
        head_dim=rng.choice((16, 32, 64, 128, 24)), rpb=rng.random() < 0.4, extra=rng.choice((0, 0, 3)),
        batch=rng.choice((1, 2)),
    )
    options["value_dim"] = rng.choice((options["head_dim"], 32))
    if pattern == "window":
        options["shift"] = tuple(shift)
    else:
        options["stride"] = tuple(stride)
    if rng.random() < 0.3:
        options["softcap"] = rng.choice((2.0, 15.0))
    if rng.random() < 0.2:
        options["scale"] = rng.choice((0.0, 0.3))
    return options


def record_launches(monkeypatch):
    """From now on, every kernel launch through ``fast_launch.resolve`` (the first of each launch
    plan; every launch under the interpreter) is appended to the returned list as (kernel name,
    what the launch returned: the compiled kernel on a GPU). Launch plans are forgotten first."""
    from haloattn.backends.triton import fast_launch

    launched = []
    resolve = fast_launch.resolve

    def recording_resolve(fn):
        class Recorder:
            def __getitem__(self, grid):
                def run(*args, **kwargs):
                    result = resolve(fn)[grid](*args, **kwargs)
                    launched.append((fn.__name__, result))
                    return result
                return run
        return Recorder()

    monkeypatch.setattr(fast_launch, "resolve", recording_resolve)
    fast_launch.clear_plans()
    return launched


def atomic_default(default_config, wide=False):
    """``tiles.default_config`` with the backward's atomic-dQ variant asked for, as the tuning
    candidates have it (``wide``: with 128-key resident tiles and 8 warps)."""
    from haloattn.backends.triton import tiles

    def config(problem, **kwargs):
        base = default_config(problem, **kwargs)
        dkdv = dict(base["dkdv"], atomic_dq=True)
        if wide:
            dkdv.update(kv=tiles.fit(dkdv["kv"], tiles.group_extents(problem), 128), warps=8)
        return dict(base, dkdv=dkdv)

    return config


gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("seed", range(12))
def test_random_problems(dtype, seed):
    options = random_problem(random.Random(seed * 7 + {torch.bfloat16: 0, torch.float16: 1, torch.float32: 2}[dtype]))
    options.update(dtype=dtype, device="cuda", seed=seed)
    spatial, window = options.pop("spatial"), options.pop("window")
    check_against_oracle(spatial, window, **options)


@gpu
@needs_cuda
@pytest.mark.parametrize("tma", [False, True], ids=["pointer-loads", "descriptor-loads"])
@pytest.mark.parametrize("seed", range(8))
def test_random_problems_per_load_path(tma, seed, monkeypatch):
    """Both ways of reading tiles (pointer gathers, tensor descriptors), whichever is the default."""
    from haloattn.backends.triton import tiles

    default = tiles.default_config
    monkeypatch.setattr(tiles, "default_config",
                        lambda p, **kw: {n: dict(c, tma=tma) for n, c in default(p, **kw).items()})
    dtype = (torch.bfloat16, torch.float16)[seed % 2]
    options = random_problem(random.Random(1000 + seed))
    options.update(dtype=dtype, device="cuda", seed=seed)
    spatial, window = options.pop("spatial"), options.pop("window")
    check_against_oracle(spatial, window, **options)


def packed_default(default_config, pack):
    """``tiles.default_config`` whose forward runs ``pack`` (batch, head) pairs a program."""
    def config(problem, **kwargs):
        base = default_config(problem, **kwargs)
        return dict(base, fwd=dict(base["fwd"], pack=pack))

    return config


@gpu
@needs_cuda
@pytest.mark.parametrize("pack", [2, 4, 16])
@pytest.mark.parametrize("seed", range(6))
def test_random_problems_in_packed_programs(pack, seed, monkeypatch):
    """Forward programs that run several (batch, head) pairs (tiles.packed_pairs), compiled: a
    packed program stores a pair's rows one step after its walk ends, through a cursor that only
    the compiled kernel can carry wrong (Triton's front end once left a copy of it out of the
    loop; the interpreter ran it right)."""
    from haloattn.backends.triton import tiles

    monkeypatch.setattr(tiles, "default_config", packed_default(tiles.default_config, pack))
    options = random_problem(random.Random(3000 + seed))
    # Three batch entries of 3, 6 or 12 heads: a last program with fewer pairs than the others,
    # heads that wrap inside a program. No additional tokens: packed programs have none.
    options.update(dtype=(torch.bfloat16, torch.float16)[seed % 2], device="cuda", seed=seed, batch=3,
                   heads=3 * options["kv_heads"], extra=0)
    spatial, window = options.pop("spatial"), options.pop("window")
    check_against_oracle(spatial, window, **options)


@gpu
@needs_cuda
@pytest.mark.parametrize("value_dim", [16, 32])
@pytest.mark.parametrize("walk", ["pointer", "pointer-one-mask", "descriptor", "descriptor-one-mask"])
def test_additional_tokens_with_narrow_values(value_dim, walk, monkeypatch):
    """Additional tokens with value tiles narrower than 64 columns: Triton 3.6 miscompiled that
    loop on Hopper (infinite outputs, illegal addresses; found by test_large_random_gpu.py seed 27),
    so the launcher pads those tiles. Every way of reading and masking the key tiles, since the
    fault came and went with the kernel's shared-memory layout."""
    from haloattn.backends.triton import tiles

    tma, one_mask = walk.startswith("descriptor"), walk.endswith("one-mask")
    default = tiles.default_config
    monkeypatch.setattr(tiles, "default_config", lambda p, **kw: {
        n: dict(c, tma=tma, anchor=not one_mask, axis_masks=not one_mask) for n, c in default(p, **kw).items()})
    check_against_oracle((7, 7, 13), (3, 6, 8), dtype=torch.bfloat16, device="cuda", heads=4, kv_heads=2,
                         head_dim=128, value_dim=value_dim, batch=3, extra=1, causal=(True, True, False),
                         scale=0.2, seed=27)


@gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("seed", range(4))
def test_random_problems_with_atomic_dq(dtype, seed, monkeypatch):
    """The opt-in non-deterministic backward (HALOATTN_DETERMINISTIC=0 and a config with
    ``atomic_dq``: dQ added with TMA bulk reductions in the KV-major pass; 64- and 128-key
    resident tiles) against the oracle, on random problems with every feature."""
    from haloattn.backends.triton import tiles

    monkeypatch.setenv("HALOATTN_DETERMINISTIC", "0")
    monkeypatch.setattr(tiles, "default_config", atomic_default(tiles.default_config, wide=seed % 2 == 1))
    launched = record_launches(monkeypatch)
    options = random_problem(random.Random(500 + seed * 3 + {torch.bfloat16: 0, torch.float16: 1, torch.float32: 2}[dtype]))
    options.update(dtype=dtype, device="cuda", seed=seed)
    spatial, window = options.pop("spatial"), options.pop("window")
    check_against_oracle(spatial, window, **options)
    assert "dq_kernel" not in {name for name, _ in launched}


@gpu
@needs_cuda
def test_tf32_within_its_tolerance():
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        check_against_oracle((9, 10), (3, 5), dtype=torch.float32, device="cuda", rpb=True, extra=2)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous


@gpu
@needs_cuda
@pytest.mark.parametrize("dtype,head_dim", [(torch.bfloat16, 128), (torch.float16, 64), (torch.float32, 32)])
def test_gradients_of_a_summed_loss(dtype, head_dim):
    """out.sum() + lse.sum(): both gradients arrive expanded (zero strides), and dO feeds the
    descriptor loads of the 16-bit backward."""
    check_against_oracle((21, 34), (5, 9), dtype=dtype, device="cuda", heads=4, kv_heads=2, head_dim=head_dim,
                         dilation=(2, 1), stride=(1, 3), rpb=True, extra=3, sum_loss=True)


@gpu
@needs_cuda
@pytest.mark.parametrize("head_dim,value_dim", [(256, 256), (192, 64), (64, 128)])
def test_head_dims(head_dim, value_dim):
    check_against_oracle((10, 12), (5, 3), dtype=torch.bfloat16, device="cuda", head_dim=head_dim,
                         value_dim=value_dim, heads=2, kv_heads=1, causal=(True, False))


@gpu
@needs_cuda
@pytest.mark.parametrize("head_dim,value_dim,spatial,window,options", [
    (256, 256, (13, 19), (5, 7), dict(dilation=(2, 1), causal=(False, True))),
    (160, 96, (70,), 21, dict(stride=3, softcap=20.0)),
    (192, 256, (5, 9, 11), (3, 5, 3), dict(causal=(True, False, False))),
    (64, 160, (21, 18), (7, 9), dict(dilation=(1, 2), extra=3)),
])
def test_wide_float32_heads_on_their_own_forward_tiles(head_dim, value_dim, spatial, window, options):
    """Float32 without TF32 above 128 channels: the default forward on tiles.EXACT_FLOAT32_FORWARD_TILES
    (16 queries, 32 keys, 4 warps), with GQA, the bias, softcap and additional tokens, against
    the oracle; every gradient too."""
    assert not torch.backends.cuda.matmul.allow_tf32
    check_against_oracle(spatial, window, dtype=torch.float32, device="cuda", head_dim=head_dim,
                         value_dim=value_dim, heads=4, kv_heads=2, rpb=True, **options)


@gpu
@needs_cuda
@pytest.mark.parametrize("head_dim,value_dim,spatial,window,options,warps", [
    (128, 128, (21, 18), (7, 9), dict(dilation=(1, 2)), 2),
    (96, 80, (33,), 9, dict(stride=2), 2),
    (64, 32, (6, 10, 12), (3, 5, 5), dict(stride=(1, 2, 1), causal=(False, False, True)), 1),
    (32, 64, (300,), 63, dict(causal=True), 1),
    (16, 16, (20, 23), (7, 5), dict(dilation=(2, 1)), 1),
    (8, 24, (4, 9, 10), (3, 3, 5), dict(causal=(True, False, False)), 1),
])
def test_float32_forward_on_its_own_small_tiles(head_dim, value_dim, spatial, window, options, warps):
    """Float32 without TF32 up to 128 channels: the default forward on 16-query / 32-key tiles of 2
    warps (65-128 channels) or 1 (up to 64), which measured 1.25-2.52x faster than the 16-bit
    tiles there (RESULTS.md, "Float32 tiles at every width"): with GQA, the bias, softcap and
    additional tokens, against the oracle."""
    from haloattn.backend import AttentionInputs
    from haloattn.backends.triton import launch, tiles
    from haloattn.problem import build_problem

    assert not torch.backends.cuda.matmul.allow_tf32
    gen = torch.Generator().manual_seed(head_dim + value_dim)

    def tensor(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).cuda()

    q, k, v = tensor(2, *spatial, 4, head_dim), tensor(2, *spatial, 2, head_dim), tensor(2, *spatial, 2, value_dim)
    windows = window if isinstance(window, tuple) else (window,) * len(spatial)
    rpb = tensor(4, *(2 * w - 1 for w in windows), scale=0.5)
    ak, av = tensor(2, 3, 2, head_dim), tensor(2, 3, 2, value_dim)
    extras = dict(rpb=rpb, additional_keys=ak, additional_values=av, softcap=20.0, **options)
    problem = build_problem(q, k, v, window, **extras)
    config = tiles.default_config(problem, exact_float32=True)
    assert (math.prod(config["fwd"]["q"]), math.prod(config["fwd"]["kv"]), config["fwd"]["warps"]) == (
        *tiles.EXACT_FLOAT32_FORWARD_TILES, warps)
    out, lse = launch.forward(problem, AttentionInputs(q, k, v, rpb, None, ak, av), config)
    ref_out, ref_lse = oracle.attention(*(t.cpu().double() for t in (q, k, v)), window, rpb=rpb.cpu().double(),
                                        additional_keys=ak.cpu().double(), additional_values=av.cpu().double(),
                                        softcap=20.0, **options)
    assert oracle.rel_error(out.cpu(), ref_out) <= oracle.TOLERANCE[torch.float32]
    assert (lse.cpu().double() - ref_lse).abs().max() <= oracle.LSE_TOLERANCE[torch.float32]


@gpu
@needs_cuda
@pytest.mark.parametrize("head_dim,value_dim,spatial,window,options", [
    (16, 16, (20, 23), (7, 5), dict(dilation=(2, 1))),
    (64, 48, (90,), 21, dict(causal=True, stride=2)),
    (128, 128, (5, 9, 11), (3, 5, 3), {}),
    (256, 192, (13, 19), (5, 7), dict(causal=(False, True), extra=3)),
])
def test_float32_on_cuda_cores(monkeypatch, head_dim, value_dim, spatial, window, options):
    """Float32 without TF32 with HALOATTN_TRITON_FLOAT32=ieee (CUDA-core products, not three TF32
    ones) on the exact-float32 tiles (tiles.EXACT_FLOAT32_FORWARD_TILES and EXACT_FLOAT32_BACKWARD,
    chosen on tf32x3 timings, at 16-256 channels): output, LSE and every gradient against the
    oracle."""
    from haloattn.backends.triton import launch

    assert not torch.backends.cuda.matmul.allow_tf32
    monkeypatch.setenv(launch.FLOAT32_PRODUCTS_ENV, "ieee")
    assert launch._precision(torch.float32) == "ieee"
    check_against_oracle(spatial, window, dtype=torch.float32, device="cuda", head_dim=head_dim,
                         value_dim=value_dim, heads=4, kv_heads=2, rpb=True, **options)


@gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("head_dim,value_dim,spatial,window,options", [
    (80, 80, (41, 38), (5, 3), {}),
    (128, 64, (300,), 15, dict(causal=True)),
    # 5x5: the 7x7 window that ran here on 2026-12-01 no longer takes the rule
    (256, 256, (21, 30), 5, dict(dilation=(2, 1), stride=2)),
    (64, 96, (6, 12, 12), 3, dict(causal=(True, False, False))),
])
def test_small_windows_on_wider_heads(dtype, head_dim, value_dim, spatial, window, options):
    """16-bit small windows above 32 channels, whose backward takes tiles.SMALL_WINDOW_BACKWARD_TILES
    (16 / 32 tokens on 2 warps): every gradient, the bias's too, against the oracle."""
    from haloattn.backends.triton import tiles
    from haloattn.problem import build_problem

    q = torch.empty(2, *spatial, 4, head_dim, device="cuda", dtype=dtype)
    v = torch.empty(2, *spatial, 2, value_dim, device="cuda", dtype=dtype)
    k = torch.empty(2, *spatial, 2, head_dim, device="cuda", dtype=dtype)
    cfg = tiles.default_config(build_problem(q, k, v, window, **options))
    assert cfg["dq"]["warps"] == tiles.SMALL_WINDOW_BACKWARD_TILES[2] and not cfg["dq"]["tma"], cfg["dq"]
    check_against_oracle(spatial, window, dtype=dtype, device="cuda", head_dim=head_dim, value_dim=value_dim,
                         batch=2, heads=4, kv_heads=2, rpb=True, **options)


@gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("head_dim,value_dim,spatial,window,options,rule_warps", [
    (160, 160, (9, 20, 14), (5, 7, 5), dict(causal=(False, False, True)), 4),
    (144, 64, (40, 37), 9, dict(dilation=(2, 1), softcap=30.0, extra=5), 4),
    (64, 160, (700,), 65, dict(stride=4), 4),
    (160, 160, (30, 30), 3, {}, 2),  # a 3x3 window: the small-window rule weighed on these tiles takes it
    (192, 192, (33, 29), (9, 13), dict(causal=(True, False)), 8),
    (256, 256, (8, 12, 12), (3, 7, 7), {}, 4),
    (256, 256, (10, 14, 14), (5, 9, 9), {}, 8),  # saves too few pairs: 64 / 64 on 8 warps
    (256, 128, (1500,), 101, dict(causal=True, extra=3), 4),
])
def test_wide_16bit_heads_on_their_backward_tiles(dtype, head_dim, value_dim, spatial, window, options, rule_warps):
    """16-bit heads above 128 channels, whose backward takes the wide heads' rules
    (tiles.WIDE_160_BACKWARD_TILES, WIDE_256_BACKWARD_TILES: 4-warp tiles at 129-160 and where
    they save pairs at 193-256 channels; 8 warps at 192; the small-window rule weighed after the
    first): every gradient, the bias's too, with GQA, against the oracle."""
    cfg, options, extra = gqa_default_config(dtype, head_dim, value_dim, spatial, window, options)
    assert cfg["dq"]["warps"] == rule_warps, cfg["dq"]
    check_against_oracle(spatial, window, dtype=dtype, device="cuda", head_dim=head_dim, value_dim=value_dim,
                         batch=2, heads=4, kv_heads=2, rpb=True, extra=extra, **options)


@gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("head_dim,value_dim,spatial,window,options,forward_tiles", [
    # tiles.WIDE_1D_FORWARD_TILES: 128 queries x 64 keys on 8 warps
    (256, 256, (2000,), 1023, dict(causal=True, extra=3), (128, 64, 8)),
    (192, 160, (1800,), 901, dict(softcap=30.0), (128, 64, 8)),
    (256, 192, (900,), 63, {}, (64, 32, 4)),  # a short window: the wide walk would cost too many pairs
    # tiles.NARROW_128_BLOCK_RULE: 64 x 64 on 4 warps where 128 x 128 was the default
    (64, 64, (3000,), 1023, dict(causal=True), (64, 64, 4)),
    (32, 48, (2600,), 1501, dict(extra=2), (64, 64, 4)),
])
def test_1d_forward_tile_rules(dtype, head_dim, value_dim, spatial, window, options, forward_tiles):
    """1-D problems on the forward tiles of the wide-head and narrow-head rules (bias and GQA
    included): every gradient against the oracle."""
    cfg, options, extra = gqa_default_config(dtype, head_dim, value_dim, spatial, window, options)
    assert (math.prod(cfg["fwd"]["q"]), math.prod(cfg["fwd"]["kv"]), cfg["fwd"]["warps"]) == forward_tiles, cfg["fwd"]
    check_against_oracle(spatial, window, dtype=dtype, device="cuda", head_dim=head_dim, value_dim=value_dim,
                         batch=2, heads=4, kv_heads=2, rpb=True, extra=extra, **options)


def gqa_default_config(dtype, head_dim, value_dim, spatial, window, options):
    """(triton's default config, the options but "extra", the additional tokens) of the batch-2
    GQA 4/2 problem the rule tests below check against the oracle."""
    from haloattn.backends.triton import tiles
    from haloattn.problem import build_problem

    options = dict(options)  # the parameter's dict is shared by both dtypes
    extra = options.pop("extra", 0)
    q = torch.empty(2, *spatial, 4, head_dim, device="cuda", dtype=dtype)
    k = torch.empty(2, *spatial, 2, head_dim, device="cuda", dtype=dtype)
    v = torch.empty(2, *spatial, 2, value_dim, device="cuda", dtype=dtype)
    return tiles.default_config(build_problem(q, k, v, window, **options)), options, extra


@gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("head_dim,value_dim,spatial,window,options", [
    (64, 64, (10, 20, 20), (5, 9, 9), dict(extra=3)),  # 32-token streamed boxes
    (128, 128, (8, 20, 20), (7, 15, 15), dict(softcap=30.0)),
    (128, 96, (32, 48), 32, dict(stride=16)),
    (64, 64, (40, 48), (9, 11), {}),  # 32-token streamed boxes
    (48, 48, (24, 12, 8), (15, 7, 3), {}),
])
def test_key_major_boxes_on_the_gpu(dtype, head_dim, value_dim, spatial, window, options):
    """16-bit problems whose dK/dV kernel takes boxes of its own (tiles.KEY_MAJOR_BOXES: another
    shape than the dQ kernel's, 32-token streamed boxes at 64 channels): every gradient, the
    bias's too, with GQA, against the oracle."""
    cfg, options, extra = gqa_default_config(dtype, head_dim, value_dim, spatial, window, options)
    assert (cfg["dkdv"]["kv"], cfg["dkdv"]["q"]) != (cfg["dq"]["q"], cfg["dq"]["kv"]), cfg
    check_against_oracle(spatial, window, dtype=dtype, device="cuda", head_dim=head_dim, value_dim=value_dim,
                         batch=2, heads=4, kv_heads=2, rpb=True, extra=extra, **options)


@gpu
@needs_cuda
@pytest.mark.parametrize("warps", [4, 8])
@pytest.mark.parametrize("head_dim,value_dim", [(72, 72), (80, 48), (144, 64), (80, 160)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_split_head_dims_on_64_query_tiles(dtype, head_dim, value_dim, warps):
    """Head dims that split into a block and a tail, with the forward on 64-query tiles of 4 and 8
    warps (what shared-memory fitting makes of a 128-query tile) and the default backward, against
    the oracle. Float32 (TF32 off: three-part products) on 8 warps read illegal addresses or came
    out wrong while it split its heads (launch.SPLIT_HEADS_UNSAFE_PRECISIONS); bfloat16 at 72
    channels (a tail of 16 with 8 masked) came out wrong on 64-query tiles, and now pads
    (tiles.head_split)."""
    from haloattn.backend import AttentionInputs
    from haloattn.backends.triton import launch, tiles
    from haloattn.problem import build_problem

    gen = torch.Generator().manual_seed(head_dim * warps + value_dim)
    window, options = (5, 4), dict(stride=(1, 3))

    def leaf(*shape):
        return torch.randn(*shape, generator=gen).to(dtype).cuda().requires_grad_(True)

    q, k, v = leaf(1, 16, 13, 2, head_dim), leaf(1, 16, 13, 2, head_dim), leaf(1, 16, 13, 2, value_dim)
    grad = torch.randn(1, 16, 13, 2, value_dim, generator=gen).to(dtype).cuda()
    problem = build_problem(q, k, v, window, **options)
    assert tiles.splits_heads(problem) == (head_dim != 72)
    config = tiles.default_config(problem)
    config = dict(config, fwd=dict(config["fwd"], q=[8, 8], kv=[8, 8], warps=warps, stages=2, pack=1))
    inputs = AttentionInputs(q.detach(), k.detach(), v.detach())
    out, lse = launch.forward(problem, inputs, config)
    grads = launch.backward(problem, inputs, out, lse, grad, None, (True, True, True, False, False, False, False))
    leaves = [t.detach().cpu().double().requires_grad_(True) for t in (q, k, v)]  # the oracle runs on the CPU
    ref_out, ref_lse = oracle.attention(*leaves, window, **options)
    ref_grads = torch.autograd.grad((ref_out * grad.cpu().double()).sum(), leaves)
    assert oracle.rel_error(out.cpu(), ref_out) <= oracle.TOLERANCE[dtype]
    assert (lse.cpu().double() - ref_lse).abs().max() <= oracle.LSE_TOLERANCE[dtype]
    for got, want in zip(grads, ref_grads):
        assert oracle.rel_error(got.cpu(), want) <= oracle.TOLERANCE[dtype]


@gpu
@needs_cuda
def test_backward_is_bitwise_repeatable():
    gen = torch.Generator(device="cuda").manual_seed(1)
    q, k, v = (torch.randn(2, 24, 20, 4, 64, device="cuda", generator=gen, dtype=torch.bfloat16) for _ in range(3))
    rpb = torch.randn(4, 13, 9, device="cuda", generator=gen)
    leaves = [t.requires_grad_(True) for t in (q, k, v, rpb)]
    grad = torch.randn(2, 24, 20, 4, 64, device="cuda", generator=gen, dtype=torch.bfloat16)

    def grads():
        out = haloattn.attention(*leaves[:3], (7, 5), rpb=leaves[3], backend=BACKEND)
        return torch.autograd.grad(out, leaves, grad)

    first, second = grads(), grads()
    for a, b in zip(first, second):
        assert torch.equal(a, b)


@gpu
@needs_cuda
@pytest.mark.device_memory
@pytest.mark.parametrize("spatial,window,tail", [((66_000,), 9, 256), ((257, 257), 7, 24)])
def test_more_than_2_31_elements_in_query(spatial, window, tail):
    """B=2, H=128, D=128: 2.16e9 elements per tensor, offsets need int64 (large_offsets.py)."""
    check_past_int32_offsets(BACKEND, spatial, window, tail=tail)


@gpu
@needs_cuda
@pytest.mark.device_memory
def test_batch_beyond_the_grid_limit():
    """B=70000 short 1-D sequences: more than the 65535 programs a grid's batch axis holds, so the
    launches run in batch slices. Output, LSE and every gradient (the bias one summed over slices)
    against the reference backend in float64."""
    gen = torch.Generator(device="cuda").manual_seed(3)
    B, L, H, D, K = 70_000, 12, 2, 16, 5

    def leaf(*shape, dtype=torch.bfloat16):
        return torch.randn(*shape, device="cuda", generator=gen).to(dtype).requires_grad_(True)

    q, k, v, rpb = leaf(B, L, H, D), leaf(B, L, 1, D), leaf(B, L, 1, D), leaf(H, 2 * K - 1)
    grad_out = torch.randn(B, L, H, D, device="cuda", generator=gen).bfloat16()
    results = {}
    for backend, leaves in ((BACKEND, (q, k, v, rpb)),
                            ("reference", [t.detach().double().requires_grad_(True) for t in (q, k, v, rpb)])):
        out, lse = haloattn.attention(*leaves[:3], K, rpb=leaves[3], stride=2, return_lse=True, backend=backend)
        grads = torch.autograd.grad((out.double() * grad_out.double()).sum() + lse.double().sum(), leaves)
        results[backend] = (out, lse, *grads)
    for name, got, want in zip(("out", "lse", "dq", "dk", "dv", "drpb"), results[BACKEND], results["reference"]):
        err = oracle.rel_error(got, want)
        assert err <= oracle.TOLERANCE[torch.bfloat16], (name, err)


@gpu
@needs_cuda
def test_repeated_calls_launch_directly_on_their_own_tensors(monkeypatch):
    """After a problem's first call its launches skip Triton's binder (fast_launch.Launch): later
    calls, forward and backward, must still read and write their own tensors."""
    from haloattn.backends.triton import fast_launch

    case = dict(dtype=torch.bfloat16, device="cuda", heads=4, kv_heads=2, head_dim=32, rpb=True, extra=3, softcap=3.0)
    check_against_oracle((9, 11), (3, 5), seed=0, **case)  # builds the launch plans
    original, resolved = fast_launch.resolve, []
    monkeypatch.setattr(fast_launch, "resolve", lambda fn: resolved.append(fn.__name__) or original(fn))
    for seed in (1, 2):
        check_against_oracle((9, 11), (3, 5), seed=seed, **case)
    assert resolved == [], "a repeated call went through Triton's binder"


@gpu
@needs_cuda
def test_plans_built_in_one_thread_run_in_another(monkeypatch):
    """Triton's allocator for on-device tensor descriptors is set per thread; a launch plan built
    in the main thread (which set it there) runs in a new thread as a server's pool would run it:
    it must set the allocator there too (descriptor_scratch), not fail in Triton's launcher."""
    import threading

    from haloattn.backends.triton import launch, tiles

    default, forced = tiles.default_config, {}

    def with_descriptors(problem, **kw):  # one dict per problem: plans are keyed by its identity
        key = (problem, tuple(sorted(kw.items())))
        if key not in forced:
            forced[key] = {n: dict(c, tma=True) for n, c in default(problem, **kw).items()}
        return forced[key]

    monkeypatch.setattr(tiles, "default_config", with_descriptors)
    case = dict(dtype=torch.bfloat16, device="cuda", heads=4, head_dim=64)
    check_against_oracle((24, 20), (7, 5), seed=0, **case)  # builds the plans here
    plans = len(launch._FORWARD_PLANS), len(launch._BACKWARD_PLANS)
    failures = []

    def in_another_thread():
        try:
            check_against_oracle((24, 20), (7, 5), seed=1, **case)
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            failures.append(exc)

    worker = threading.Thread(target=in_another_thread)
    worker.start()
    worker.join()
    assert not failures, failures[0]
    assert (len(launch._FORWARD_PLANS), len(launch._BACKWARD_PLANS)) == plans, "the thread built plans of its own"


@gpu
@needs_cuda
def test_degenerate_builds_are_rebuilt_capped_and_give_the_same_results(monkeypatch):
    """A kernel ptxas built with few registers and the rest in local memory is rebuilt with
    ``maxnreg`` 255 (fast_launch.Launch; CPU test: test_triton_neighborhood.py). Hopper builds no
    such kernel on its own, so here every first build counts as degenerate: the rebuilt kernels,
    compiled by Triton's warm-up and launched from the second call on, give the oracle's results."""
    from haloattn.backends.triton import fast_launch

    monkeypatch.setattr(fast_launch, "built_degenerately", lambda registers, local_bytes: True)
    plans, rebuild = [], fast_launch.Launch._rebuilt_if_degenerate
    monkeypatch.setattr(fast_launch.Launch, "_rebuilt_if_degenerate",
                        lambda plan, compiled, arguments: plans.append(plan) or rebuild(plan, compiled, arguments))
    fast_launch.clear_plans()
    case = dict(dtype=torch.bfloat16, device="cuda", heads=4, kv_heads=2, head_dim=64, rpb=True, softcap=5.0)
    try:
        for seed in (0, 1):  # the first call builds and rebuilds, the second launches the rebuilt kernels
            check_against_oracle((9, 11), (3, 5), seed=seed, **case)
    finally:
        fast_launch.clear_plans()
    built = {plan.kernel.__name__ for plan in plans}
    assert {"forward_kernel", "dq_kernel", "dkdv_kernel"} <= built, built
    assert all(plan.options.get("maxnreg") == 255 for plan in plans)


@gpu
@needs_cuda
# It compiles every kernel twice with small tiles: 127 s alone on an H100, past a 200 s --timeout
# under six compiling workers; a run's --timeout should not fail it for that.
@pytest.mark.timeout(900)
@pytest.mark.parametrize("optin_kib", [99, 163], ids=["99KiB-ada-ampere-consumer", "163KiB-a100"])
def test_configs_for_smaller_gpus_compile_within_their_shared_memory(optin_kib, monkeypatch):
    """The Hopper here stands in for GPUs with less shared memory per block: with the device limit
    set to theirs, the chosen tiles still give correct results, and every kernel launched for them
    fits in that limit (there Triton would refuse the launch with OutOfResources)."""
    from haloattn.backends.triton import device_limits, fast_launch, tiles

    def forget():  # configs, budgets and launch plans are cached per problem and device
        for cached in (tiles.default_config, tiles._best_forward, device_limits._cuda_tile_budget):
            cached.cache_clear()
        fast_launch.clear_plans()

    monkeypatch.setattr(device_limits, "shared_memory_limit", lambda device: optin_kib * 1024)
    launched = record_launches(monkeypatch)
    forget()
    try:
        # Problems whose default tiles differ from Hopper's at this limit (the CPU test
        # test_configs_fit_the_shared_memory_of_the_device checks the sizes of every config).
        check_against_oracle((384,), 129, dtype=torch.float16, device="cuda", head_dim=256, heads=1, seed=12)
        if optin_kib < 163:
            check_against_oracle((24, 40), (13, 9), dtype=torch.bfloat16, device="cuda", head_dim=128, heads=2,
                                 kv_heads=1, rpb=True, seed=11)
    finally:
        monkeypatch.undo()
        forget()
    names = {name for name, _ in launched}
    assert {"forward_kernel", "dq_kernel", "dkdv_kernel"} <= names, names
    for _, kernel in launched:
        assert kernel.metadata.shared <= optin_kib * 1024, (kernel.name, kernel.metadata.shared)


@gpu
@needs_cuda
@pytest.mark.xfail(strict=True, reason="ptxas (12.8 and 13.0) allocates the probabilities over the query's "
                   "registers inside the key loop when the query tile comes through a host-descriptor box "
                   "(RESULTS.md, 'Query-tile boxes'); a toolchain that keeps them apart makes this pass, and "
                   "launch.HOST_QUERY_BOXES can then be measured again")
def test_query_box_forward_equals_pointers(monkeypatch):
    """The forward with its query tile read through a host-descriptor box (off by default:
    launch.HOST_QUERY_BOXES) against the default pointer load, bit for bit, at 64 channels in
    bfloat16, where the H100 build of 2026-12-06 multiplied the probabilities instead of the
    queries from the second key tile on. The output box alone is right (its own half below)."""
    from haloattn.backend import AttentionInputs
    from haloattn.backends.triton import fast_launch, launch, tiles
    from haloattn.problem import build_problem

    gen = torch.Generator().manual_seed(65)
    q, k, v = (torch.randn(1, 64, 64, 4, 64, generator=gen).bfloat16().cuda() for _ in range(3))
    problem = build_problem(q, k, v, 31)
    config = tiles.default_config(problem)
    outputs = {}
    try:
        for query, output in ((False, False), (False, True), (True, False)):
            monkeypatch.setattr(launch, "HOST_QUERY_BOXES", {"query": query, "output": output})
            fast_launch.clear_plans()
            outputs[query, output] = launch.forward(problem, AttentionInputs(q, k, v), config)
    finally:
        monkeypatch.undo()
        fast_launch.clear_plans()
    base_out, base_lse = outputs[False, False]
    box_out, box_lse = outputs[False, True]
    assert torch.equal(box_out, base_out) and torch.equal(box_lse, base_lse), "the output box alone"
    query_out, query_lse = outputs[True, False]
    assert torch.equal(query_out, base_out) and torch.equal(query_lse, base_lse), "the query box"
