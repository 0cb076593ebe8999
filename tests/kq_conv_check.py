"""The key-query convolution through backend ``triton`` against the float64 oracle: shared by the
CPU interpreter tests (test_triton_kq_conv.py) and the GPU ones (test_triton_kq_conv_gpu.py).
No import-time side effects."""

import torch

import haloattn
import oracle

LEAVES = ("query", "key", "value", "rpb", "kq_conv", "additional_keys", "additional_values")


def kq_conv_inputs(length, window, *, dtype=torch.float32, device="cpu", batch=1, heads=2, kv_heads=None,
                   head_dim=16, value_dim=None, kernel=(3, 5), rpb=False, extra=0, seed=0):
    """Fresh random leaves (float32 kernel and bias tables, as models keep them beside 16-bit tokens)."""
    kv_heads = kv_heads or heads
    value_dim = value_dim or head_dim
    gen = torch.Generator().manual_seed(seed)

    def leaf(*shape, scale=1.0, dt=dtype):
        return (torch.randn(*shape, generator=gen) * scale).to(dt).to(device).requires_grad_(True)

    leaves = {
        "query": leaf(batch, length, heads, head_dim),
        "key": leaf(batch, length, kv_heads, head_dim),
        "value": leaf(batch, length, kv_heads, value_dim),
        "kq_conv": leaf(heads, *kernel, scale=0.4, dt=torch.float32),
    }
    if rpb:
        leaves["rpb"] = leaf(heads, 2 * window - 1, scale=0.5, dt=torch.float32)
    if extra:
        leaves["additional_keys"] = leaf(batch, extra, kv_heads, head_dim)
        leaves["additional_values"] = leaf(batch, extra, kv_heads, value_dim)
    return leaves, gen


def check_kq_conv(length, window, *, dtype=torch.float32, device="cpu", grad_lse=True, frozen=(), seed=0,
                  batch=1, heads=2, kv_heads=None, head_dim=16, value_dim=None, kernel=(3, 5), rpb=False, extra=0,
                  **options):
    """Output, LSE and the gradient of every leaf not in ``frozen``, against the oracle; returns
    the relative errors."""
    leaves, gen = kq_conv_inputs(length, window, dtype=dtype, device=device, batch=batch, heads=heads,
                                 kv_heads=kv_heads, head_dim=head_dim, value_dim=value_dim, kernel=kernel, rpb=rpb,
                                 extra=extra, seed=seed)
    for name in frozen:
        leaves[name].requires_grad_(False)
    q, k, v = leaves.pop("query"), leaves.pop("key"), leaves.pop("value")
    out, lse = haloattn.attention(q, k, v, window, return_lse=True, backend="triton", **leaves, **options)
    grad_out = torch.randn(out.shape, generator=gen).to(dtype).to(device)
    grad_lse_in = torch.randn(lse.shape, generator=gen).to(device) if grad_lse else torch.zeros_like(lse)
    all_leaves = {"query": q, "key": k, "value": v, **leaves}
    names = [n for n in LEAVES if n in all_leaves and all_leaves[n].requires_grad]
    loss = (out.float() * grad_out.float()).sum() + (lse * grad_lse_in).sum()
    grads = torch.autograd.grad(loss, [all_leaves[n] for n in names])

    ref = {n: t.detach().cpu().double().requires_grad_(t.requires_grad) for n, t in all_leaves.items()}
    ref_out, ref_lse = oracle.attention(ref["query"], ref["key"], ref["value"], window,
                                        **{n: ref[n] for n in LEAVES[3:] if n in ref}, **options)
    ref_grads = torch.autograd.grad((ref_out * grad_out.cpu().double()).sum()
                                    + (ref_lse * grad_lse_in.cpu().double()).sum(), [ref[n] for n in names])
    tol, lse_tol = oracle.TOLERANCE[dtype], oracle.LSE_TOLERANCE[dtype]
    errors = {"out": oracle.rel_error(out.cpu(), ref_out)}
    for n, g, rg in zip(names, grads, ref_grads):
        errors["d" + n] = oracle.rel_error(g.cpu(), rg)
    bad = {n: e for n, e in errors.items() if not e <= tol}
    assert not bad, f"relative errors above {tol}: {bad} (all: {errors})"
    lse_err = (lse.detach().cpu().double() - ref_lse.detach()).abs().max().item()
    assert lse_err <= lse_tol, f"lse max abs error {lse_err}"
    return errors
