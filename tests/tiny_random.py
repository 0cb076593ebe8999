"""Tiny random problems through a fused backend against the float64 oracle: forward, LSE and
every gradient, one seed per problem (the generator and the check of
``benchmarks/sweep_interpreter.py``, which runs them under Triton's interpreter or compiled, and of
``tests/test_tiny_random_gpu.py``, which runs them compiled). No import-time side effects: the
caller decides how Triton runs before importing Triton.

Each seed draws a rank (1-3), a pattern (neighbourhood, or window with shift), per-axis lengths,
windows, strides, dilations and causality, GQA, head dims, rpb, softcap, scales (default,
positive, negative, zero), additional tokens, and a loss: on the output, on output and LSE with
random weights, or ``out.sum() + lse.sum()`` (gradients that arrive expanded). Float32: a
gradient passes within max(1e-5, 3x what a plain float32 computation of the contract misses by on
the same inputs) (1e-3 floor for rpb): the floor keeps ill-conditioned problems (cancelling sums)
from failing a correct kernel, and a wrong gradient is off by order 1 anyway. 16-bit inputs are
held to their dtype's tolerance (oracle.TOLERANCE), the gradients' floor computed in that dtype.
"""

import random

import torch

import haloattn
import oracle
from haloattn.dispatch import BackendUnavailableError
from test_reference_oracle import make_inputs

RPB_GRAD_FLOOR = 1e-3  # float32's floor for the bias gradient (a sum over every pair of a head)
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
HEAD_DIMS = (8, 16, 32)


def _alibi(s, b, h, q_idx, kv_idx):
    return s - 0.05 * (h + 1) * (q_idx - kv_idx).abs()


def _gate(s, b, h, q_idx, kv_idx):
    return torch.where(kv_idx <= q_idx, torch.tanh(s * 0.5) * 3.0, s + 0.25 * b)


def _index_arithmetic(s, b, h, q_idx, kv_idx):
    return s + ((q_idx - kv_idx) // 3) * 0.1 + ((q_idx * 7 + kv_idx) % 5) * 0.05


def _checker(b, h, q_idx, kv_idx):
    return ((q_idx + kv_idx) % 2 == 0) | (q_idx == kv_idx)


def _documents(b, h, q_idx, kv_idx):
    return torch.div(q_idx, 5, rounding_mode="floor") == torch.div(kv_idx, 5, rounding_mode="floor")


def _per_head(b, h, q_idx, kv_idx):
    return (kv_idx + h) % 3 != 0


# Mods of the --mods sweep: elementwise, no captured tensors (the backend runs on its device, the
# oracle on the CPU); masks may leave a row without keys (its gradients are then not compared).
SCORE_MODS = (None, _alibi, _gate, _index_arithmetic)
MASK_MODS = (None, _checker, _documents, _per_head)


def random_spec(seed: int, head_dims=HEAD_DIMS, kq_conv: bool = False, mods: bool = False):
    """A problem (in test_reference_oracle.make_inputs's format) and a loss kind. ``kq_conv``: a
    rank-1 problem with a key-query convolution of 1-6 x 1-11; ``mods``: a score_mod and / or a
    mask_mod from SCORE_MODS / MASK_MODS (other seeds draw as before)."""
    r = random.Random(seed)
    rank = 1 if kq_conv else r.choice((1, 2, 2, 3))
    pattern = "neighborhood" if r.random() < 0.8 else "window"
    max_length = {1: 40, 2: 11, 3: 6}[rank]
    spatial, window, stride, dilation, causal, shift = [], [], [], [], [], []
    for _ in range(rank):
        length = r.randint(2, max_length)
        dil = r.choice((1, 1, 2)) if length >= 4 else 1
        k = r.randint(1 if pattern == "window" else 2, max(2, length // dil)) if length // dil >= 2 else 1
        spatial.append(length)
        window.append(k)
        dilation.append(dil)
        causal.append(r.random() < 0.3)
        stride.append(r.randint(1, k) if pattern == "neighborhood" and r.random() < 0.3 else 1)
        shift.append(r.randint(0, k - 1) if pattern == "window" else 0)
    kv_heads = r.choice((1, 2))
    kw = dict(dilation=tuple(dilation), causal=tuple(causal), pattern=pattern)
    if pattern == "window":
        kw["shift"] = tuple(shift)
    else:
        kw["stride"] = tuple(stride)
    spec = dict(spatial=tuple(spatial), batch=r.choice((1, 2)), heads=kv_heads * r.choice((1, 2)), kv_heads=kv_heads,
                head_dim=r.choice(head_dims), value_dim=r.choice(head_dims), kw=kw, window=tuple(window),
                rpb=r.random() < 0.3, softcap=r.choice((None, None, None, 4.0)),
                scale=r.choice((None, None, 0.3, 2.5, -0.7, 0.0)), extra=r.choice((0, 0, 2)),
                score_mod=None, mask_mod=None, kq_conv=None, seed=seed)
    if kq_conv:
        spec["kq_conv"] = (r.randint(1, 6), r.choice((1, 3, 5, 11)))
    if mods:
        spec["score_mod"], spec["mask_mod"] = r.choice(SCORE_MODS), r.choice(MASK_MODS)
        if spec["score_mod"] is None and spec["mask_mod"] is None:
            spec["score_mod"] = _gate
    return spec, r.choice(("out", "lse", "sum"))


def _on_device(t, device: str):
    """A leaf copy of ``t`` on ``device`` that keeps its requires_grad (other values as they are)."""
    if not isinstance(t, torch.Tensor):
        return t
    return t.detach().to(device).requires_grad_(t.requires_grad)


def _leaves(tensors: dict, kw: dict) -> list:
    extras = [kw.get(name) for name in ("rpb", "kq_conv", "additional_keys", "additional_values")]
    return [t for t in list(tensors.values()) + extras if t is not None]


def _refusal(exc: BackendUnavailableError, backend: str) -> str:
    """The refused backend's own line of the dispatcher's message (the whole message is explain()'s
    table, whose first 200 characters are the problem, not the reason)."""
    lines = str(exc).splitlines()
    own = [line.strip() for line in lines if line.split()[1:2] == [backend]]
    return own[0] if own else lines[0]


def check(seed: int, backend: str, head_dims=HEAD_DIMS, device: str = "cpu", dtype=torch.float32,
          kq_conv: bool = False, mods: bool = False) -> str:
    """The backend on ``device`` against the oracles, which run on the CPU (leaves of their own with
    the same values); errors are measured there. 16-bit inputs are held to SEMANTICS.md's
    tolerances of their dtype (oracle.TOLERANCE), the gradients' floor computed in that dtype."""
    spec, loss_kind = random_spec(seed, head_dims, kq_conv, mods)
    tensors, kw = make_inputs(spec, dtype, requires_grad=True)
    tolerance, lse_tolerance = oracle.TOLERANCE[dtype], oracle.LSE_TOLERANCE[dtype]
    run_tensors = {name: _on_device(t, device) for name, t in tensors.items()}
    run_kw = {name: _on_device(value, device) for name, value in kw.items()}
    try:
        out, lse = haloattn.attention(*run_tensors.values(), spec["window"], return_lse=True, backend=backend,
                                      **run_kw)
    except BackendUnavailableError as exc:  # the backend refuses the problem and says why
        return f"REFUSED {_refusal(exc, backend)}"
    out_cpu, lse_cpu = out.cpu(), lse.cpu()  # differentiable copies: gradients reach the run's leaves
    ref_out, ref_lse = oracle.attention(*tensors.values(), spec["window"], **kw)
    errors = []
    finite = torch.isfinite(ref_lse)
    if oracle.rel_error(out_cpu, ref_out) > tolerance:
        errors.append(f"out {oracle.rel_error(out_cpu, ref_out):.2e}")
    if finite.any():
        lse_error = (lse_cpu.double() - ref_lse)[finite].abs().max().item()
        if lse_error > lse_tolerance * max(1.0, ref_lse[finite].abs().max().item()):
            errors.append(f"lse {lse_error:.2e}")
    if finite.all():  # rows that see nothing have no gradient to compare
        leaves = _leaves(tensors, kw)
        gen = torch.Generator().manual_seed(seed)
        w_out = torch.randn(out.shape, generator=gen, dtype=torch.float64)
        w_lse = torch.randn(lse.shape, generator=gen, dtype=torch.float64)

        def loss(o, l):
            if loss_kind == "sum":
                return o.double().sum() + l.double().sum()
            return (o.double() * w_out).sum() + ((l.double() * w_lse).sum() if loss_kind == "lse" else 0.0)

        got = [g.cpu() for g in torch.autograd.grad(loss(out_cpu, lse_cpu), _leaves(run_tensors, run_kw))]
        want = torch.autograd.grad(loss(ref_out, ref_lse), leaves)
        # The rounding floor: the contract computed plainly in the inputs' dtype (float32 for float32).
        plain_out, plain_lse = oracle.attention(*tensors.values(), spec["window"], compute_dtype=dtype, **kw)
        plain = torch.autograd.grad(loss(plain_out, plain_lse), leaves)
        # ... which can round a cancelling gradient to 0 exactly where a kernel's order does not:
        # the modelled rounding of the backward's dS as well
        if loss_kind == "sum":  # the loss's gradients with respect to out and lse
            seed_out, seed_lse = torch.ones_like(w_out), torch.ones_like(w_lse)
        else:
            seed_out, seed_lse = w_out, (w_lse if loss_kind == "lse" else None)
        modelled = oracle.gradient_rounding_floor(*tensors.values(), spec["window"], seed_out, seed_lse, leaves,
                                                  seed=seed, **kw)
        for leaf, a, b, f, m in zip(leaves, got, want, plain, modelled):
            floor = RPB_GRAD_FLOOR if leaf is kw.get("rpb") and dtype == torch.float32 else tolerance
            allowed = max(floor, 3 * oracle.rel_error(f, b), 4 * oracle.rounding_share(m, b))
            if oracle.rel_error(a, b) > allowed:
                errors.append(f"grad {tuple(a.shape)} {oracle.rel_error(a, b):.2e} (tolerance {allowed:.1e})")
    return "OK" if not errors else f"FAIL {'; '.join(errors)} {spec}"
