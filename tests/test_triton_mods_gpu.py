"""score_mod and mask_mod compiled into backend triton's kernels, on a CUDA GPU, against the float64
oracle: random problems (rank 1-3, every pattern option, GQA, rpb, softcap, additional tokens) with
mods drawn from a pool that covers captured tables, integer index arithmetic of both signs, gates
and masks that empty whole rows, in float16, bfloat16 and float32. Run with ``pytest -m gpu``."""

import random

import pytest
import torch

from mods_check import checkerboard, check_mods, gated, sparse_rows

gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _table_mods(rng: random.Random, heads: int, tokens: int):
    """A score_mod reading captured tables (per-head slopes, a relative-offset table), built on
    either device from the same values."""
    slopes = torch.rand(heads, generator=torch.Generator().manual_seed(rng.randint(0, 10**6))) + 0.05
    offsets = torch.randn(heads, 33, generator=torch.Generator().manual_seed(rng.randint(0, 10**6)))

    def on(device):
        s_dev, o_dev = slopes.to(device), offsets.to(device)

        def score_mod(s, b, h, q_idx, kv_idx):
            return s - s_dev[h] * (q_idx - kv_idx).abs() / tokens + o_dev[h, (q_idx - kv_idx).clamp(-16, 16)]
        return dict(score_mod=score_mod)
    return on


def _document_mask(tokens: int, documents: int):
    edges = max(1, tokens // documents)

    def mask_mod(b, h, q_idx, kv_idx):
        return torch.div(q_idx, edges, rounding_mode="floor") == torch.div(kv_idx, edges, rounding_mode="floor")
    return mask_mod


def random_mods_problem(rng: random.Random) -> dict:
    rank = rng.choice((1, 2, 2, 3))
    spatial = {1: lambda: (rng.randint(30, 300),), 2: lambda: (rng.randint(5, 24), rng.randint(5, 24)),
               3: lambda: (rng.randint(2, 6), rng.randint(4, 10), rng.randint(4, 10))}[rank]()
    pattern = rng.choice(("neighborhood", "neighborhood", "window"))
    options = dict(pattern=pattern)
    window, dilation = [], []
    for length in spatial:
        d = rng.choice((1, 1, 2)) if length >= 8 else 1
        dilation.append(d)
        window.append(rng.randint(2, max(2, min(length // d, 9))))
    options["dilation"] = tuple(dilation)
    options["causal"] = tuple(rng.random() < 0.3 for _ in spatial)
    if pattern == "neighborhood" and rng.random() < 0.4:
        options["stride"] = tuple(rng.randint(1, w) for w in window)
    if pattern == "window" and rng.random() < 0.5:
        options["shift"] = tuple(rng.randint(0, w - 1) for w in window)
    heads = rng.choice((1, 2, 4))
    tokens = 1
    for length in spatial:
        tokens *= length
    options.update(heads=heads, kv_heads=rng.choice([h for h in (1, 2, 4) if heads % h == 0]),
                   head_dim=rng.choice((16, 32, 64, 128)), batch=rng.choice((1, 2)))
    options["value_dim"] = rng.choice((options["head_dim"], 64))
    if rng.random() < 0.3:
        options["softcap"] = rng.choice((3.0, 20.0))
    if rng.random() < 0.3:
        options["rpb"] = True
    if rng.random() < 0.2:
        options["extra"] = rng.randint(1, 9)
    kind = rng.choice(("table", "gate", "mask", "document", "both", "sparse"))
    if kind in ("table", "both"):
        options["mods_on"] = _table_mods(rng, heads, tokens)
    if kind == "gate":
        options["score_mod"] = gated
    if kind in ("mask", "both"):
        options["mask_mod"] = checkerboard
    if kind == "document":
        options["mask_mod"] = _document_mask(tokens, rng.randint(2, 5))
    if kind == "sparse":
        options["mask_mod"] = sparse_rows
    return dict(spatial=tuple(spatial), window=tuple(window), **options)


@gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("seed", range(12))
def test_random_problems_with_mods(seed, dtype):
    rng = random.Random(31000 + seed)
    problem = random_mods_problem(rng)
    spatial, window = problem.pop("spatial"), problem.pop("window")
    check_mods(spatial, window, dtype=dtype, device="cuda", seed=seed, **problem)


@gpu
@needs_cuda
@pytest.mark.parametrize("spatial,window,rows_per_part", [((4096,), (1023,), 300), ((64, 64), (21, 21), 640),
                                                        ((8, 24, 24), (5, 11, 11), 1152)])
def test_documents_that_empty_most_steps(spatial, window, rows_per_part):
    """Long windows over short documents (parts of ``rows_per_part`` flat tokens): most steps of
    each walk lie in other documents and are skipped (live_steps.py), at the default tiles."""
    def on(device):
        def mask_mod(b, h, q_idx, kv_idx):
            return q_idx // rows_per_part == kv_idx // rows_per_part
        return dict(mask_mod=mask_mod)
    check_mods(spatial, window, heads=2, kv_heads=1, head_dim=64, batch=1, dtype=torch.bfloat16, device="cuda",
               mods_on=on)


@gpu
@needs_cuda
def test_kernels_still_compile_after_a_mods_check():
    """The check of a mod runs its generated code compiled on the GPU: an interpreted check left
    triton.language patched for the interpreter, and every kernel compiled after it in the
    process failed (2026-12-05). A new problem (its own head dim, so its own compile) after a
    checked mod must build and match the oracle."""
    check_mods((40,), (7,), heads=2, head_dim=16, dtype=torch.float16, device="cuda",
               mods_on=lambda device: dict(mask_mod=checkerboard, score_mod=gated))
    check_mods((9, 11), (3, 5), heads=2, head_dim=40, dtype=torch.float16, device="cuda")
