"""Problems with score_mod / mask_mod through backend triton against the float64 oracle, and the
mods the tests use (tests/test_triton_mods.py on the CPU interpreter, test_triton_mods_gpu.py on a
GPU). Mods act on tensors that broadcast (the oracle calls them on [B, H, N, N] index grids)."""

import torch

import haloattn
import oracle

FLOAT32_TOLERANCE = 1e-5
BFLOAT16_TOLERANCE = 1.5e-2
FLOAT16_TOLERANCE = 2e-3
TOLERANCES = {torch.float32: FLOAT32_TOLERANCE, torch.bfloat16: BFLOAT16_TOLERANCE, torch.float16: FLOAT16_TOLERANCE}


def alibi(slopes):
    def score_mod(s, b, h, q, kv):
        return s - slopes[h] * (q - kv).abs()
    return score_mod


def checkerboard(b, h, q, kv):
    return ((q + kv) % 2 == 0) | (q == kv)


def gated(s, b, h, q, kv):
    return torch.where(kv <= q, torch.tanh(s * 0.5) * 3.0, s + 0.25 * b)


def sparse_rows(b, h, q, kv):
    # Queries divisible by 5 see no key at all (output 0, LSE -inf, no gradient).
    return (q % 5 != 0) & (kv % 3 != h % 3)


def per_head_extras(b, h, q, kv, tokens):
    return (kv < tokens) | ((kv - tokens + h) % 2 == 0)


def relative_error(x, ref):
    return ((x.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def check_mods(spatial, window, *, heads=4, kv_heads=2, head_dim=16, value_dim=None, batch=2, dtype=torch.float32,
               extra=0, rpb=False, seed=0, device="cpu", mods_on=None, **options):
    """One problem through backend triton (``dtype``, on ``device``) against the float64 oracle:
    output, LSE and the gradients of every input, within SEMANTICS.md's tolerances (gradients of
    16-bit runs twice the output's). ``mods_on(device)`` gives mods whose captured tensors live on
    that device (the oracle runs on the CPU). Returns which rows attend to any key."""
    torch.manual_seed(seed)
    value_dim = value_dim or head_dim
    q = torch.randn(batch, *spatial, heads, head_dim, dtype=torch.float64)
    k = torch.randn(batch, *spatial, kv_heads, head_dim, dtype=torch.float64)
    v = torch.randn(batch, *spatial, kv_heads, value_dim, dtype=torch.float64)
    leaves = [q, k, v]
    if rpb:
        table = torch.randn(heads, *(2 * w - 1 for w in window), dtype=torch.float64) * 0.5
        options["rpb"] = table
        leaves.append(table)
    if extra:
        options["additional_keys"] = torch.randn(batch, extra, kv_heads, head_dim, dtype=torch.float64)
        options["additional_values"] = torch.randn(batch, extra, kv_heads, value_dim, dtype=torch.float64)
        leaves += [options["additional_keys"], options["additional_values"]]
    grad_out = torch.randn(batch, *spatial, heads, value_dim, dtype=torch.float64)
    grad_lse = torch.randn(batch, *spatial, heads, dtype=torch.float64)

    ours = [t.to(device=device, dtype=dtype).requires_grad_(True) for t in leaves]
    ours_options = dict(options, **(mods_on(device) if mods_on else {}))
    names = ["rpb"] * rpb + ["additional_keys", "additional_values"] * bool(extra)
    for name, t in zip(names, ours[3:]):
        ours_options[name] = t
    out, lse = haloattn.attention(*ours[:3], window, return_lse=True, backend="triton", **ours_options)
    out, lse = out.cpu(), lse.cpu()
    finite = torch.isfinite(lse)
    (out.double() * grad_out).sum().add((lse.double() * grad_lse)[finite].sum()).backward()

    theirs = [t.clone().requires_grad_(True) for t in leaves]
    their_options = dict(options, **(mods_on("cpu") if mods_on else {}))
    for name, t in zip(names, theirs[3:]):
        their_options[name] = t
    ref_out, ref_lse = oracle.attention(*theirs[:3], window, **their_options)
    ref_finite = torch.isfinite(ref_lse)
    assert torch.equal(finite, ref_finite)
    (ref_out * grad_out).sum().add((ref_lse * grad_lse)[ref_finite].sum()).backward()

    tolerance = TOLERANCES[dtype]
    assert relative_error(out, ref_out) < tolerance
    lse_error = (lse.double() - ref_lse)[finite].abs().max().item() if finite.any() else 0.0
    assert lse_error < (1e-4 if dtype == torch.float32 else 2e-2)
    for mine, reference in zip(ours, theirs):
        assert torch.isfinite(mine.grad).all()
        assert relative_error(mine.grad.cpu(), reference.grad) < tolerance * (1 if dtype == torch.float32 else 2)
    return finite
