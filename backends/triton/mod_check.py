"""The check a generated mod passes before a kernel uses it (mod_codegen): the device functions,
run by Triton's CPU interpreter on sample points, against the user's own functions in PyTorch on
the same points (values, and derivatives by autograd). The points are pairs the problem attends
(a query drawn per axis, a key from its window; additional tokens too), which every backend
evaluates the mods on: a table indexed by ``q_idx - kv_idx`` may cover only the window's offsets.
Scores are random normals, scaled by 4.
"""

from __future__ import annotations

import functools
import threading

import torch
import triton
import triton.language as tl

from haloattn.geometry import key_range

from .mod_codegen import CHECK_POINTS, MAX_CAPTURED, ModsNotFusable, fused_mods
from .plugin import interpreting


@triton.jit
def _score_points(S, B, H, Q, KV, OUT, T0, T1, T2, T3, FN: tl.constexpr, N: tl.constexpr):
    i = tl.arange(0, N)
    out = FN(tl.load(S + i), tl.load(B + i), tl.load(H + i), tl.load(Q + i), tl.load(KV + i), T0, T1, T2, T3)
    tl.store(OUT + i, out)


@triton.jit
def _mask_points(B, H, Q, KV, OUT, T0, T1, T2, T3, FN: tl.constexpr, N: tl.constexpr):
    i = tl.arange(0, N)
    out = FN(tl.load(B + i), tl.load(H + i), tl.load(Q + i), tl.load(KV + i), T0, T1, T2, T3)
    tl.store(OUT + i, out.to(tl.int8))


def _points(problem, seed: int):
    """CHECK_POINTS attended pairs of ``problem`` (the pattern's own, and additional tokens where
    it has them), drawn at random: pairs every backend evaluates the mods on, so the user's
    functions are defined there."""
    g = torch.Generator().manual_seed(seed)
    n = CHECK_POINTS
    b = torch.randint(0, problem.batch, (n,), generator=g)
    h = torch.randint(0, problem.heads, (n,), generator=g)
    q = torch.zeros(n, dtype=torch.int64)
    kv = torch.zeros(n, dtype=torch.int64)
    for axis in problem.axes:
        i = torch.randint(0, axis.length, (n,), generator=g)
        group, lo, hi = key_range(axis, problem.pattern, i)
        y = lo + (torch.rand(n, generator=g) * (hi - lo)).long().clamp(max=(hi - lo - 1).clamp(min=0))
        q = q * axis.length + i
        kv = kv * axis.length + y * axis.dilation + group
    if problem.extra_tokens:
        extra = torch.rand(n, generator=g) < 0.25
        kv = torch.where(extra, problem.tokens + torch.randint(0, problem.extra_tokens, (n,), generator=g), kv)
    s = torch.randn(n, generator=g) * 4.0
    return s, b, h, q, kv


def _check_device(problem) -> torch.device:
    """Where the check runs the generated functions: compiled on the problem's GPU, as the kernels
    will run them, or in Triton's interpreter on the CPU where the kernels are interpreted too.
    Never interpreted in a process that compiles: an interpreted run leaves triton.language
    patched for the interpreter, and every kernel compiled after it in the process then fails
    ("'ir.value' object has no attribute 'dtype'", H100, 2026-12-05)."""
    if problem.device.type == "cuda" and not interpreting():
        return problem.device
    return torch.device("cpu")


def _run_points(kernel, device: torch.device, *args, **constexprs):
    if device.type == "cuda":
        kernel[(1,)](*args, **constexprs)
    else:
        from .interpreter_compat import kernel as interpreted

        interpreted(kernel)[(1,)](*args, **constexprs)


def _user_scores(score_mod, s, b, h, q, kv, device):
    """score_mod's values and derivatives at the points, by autograd (not the torch.func.grad the
    translation's derivative is traced from: the check is independent of it)."""
    with torch.enable_grad():
        s = s.to(device, copy=True).requires_grad_(True)
        out = score_mod(s, b.to(device), h.to(device), q.to(device), kv.to(device)).to(torch.float32)
        out = out.expand_as(s) if out.shape != s.shape else out
        (slope,) = torch.autograd.grad(out.sum(), s, allow_unused=True) if out.requires_grad else (None,)
    if slope is None:
        slope = torch.zeros_like(s)
    return out.detach().cpu(), slope.detach().cpu()


def _disagreement(name: str, ours: torch.Tensor, theirs: torch.Tensor, points) -> None:
    """Raise where ``ours`` (the generated code's) and ``theirs`` (PyTorch's) differ at a point."""
    both_special = ~torch.isfinite(ours) & ~torch.isfinite(theirs) & ((ours == theirs) | (ours.isnan() & theirs.isnan()))
    differ = ~both_special & ~((ours - theirs).abs() <= 1e-5 + 1e-4 * theirs.abs())
    if differ.any():
        i = int(differ.nonzero()[0, 0])
        s, b, h, q, kv = points
        raise ModsNotFusable(
            f"{name}: the compiled code disagrees with the function (at b={int(b[i])}, h={int(h[i])}, "
            f"q_idx={int(q[i])}, kv_idx={int(kv[i])}, score {float(s[i]):.4g}: {float(ours[i]):.6g} "
            f"against {float(theirs[i]):.6g})")


@functools.lru_cache(maxsize=256)
def checked_mods(problem):
    """fused_mods for the problem's mods, checked on attended pairs of the problem (once per
    problem); raises ModsNotFusable, also where anything else fails on the way (the generated code
    does not load or run, the user's function raises on the sample pairs)."""
    try:
        mods = _outside_transforms(_compiled_and_checked, problem)
    except ModsNotFusable:
        raise
    except Exception as err:  # noqa: BLE001 - any failure of generated or user code is a reason
        raise ModsNotFusable(f"the mods could not be compiled and checked ({type(err).__name__}: "
                             f"{str(err).strip().splitlines()[-1][:160] if str(err).strip() else ''})") from None
    return mods


def _compiled_and_checked(problem):
    mods = fused_mods(problem.score_mod, problem.mask_mod, problem.device)
    _check(problem, mods)
    return mods


def _outside_transforms(fn, *args):
    """``fn(*args)`` on a thread of its own: torch.func's transforms (a jvp or vmap the call runs
    under), autograd's grad mode and the device are per thread, so the trace and the check see the
    functions themselves, with autograd on. (Disabling the transforms in place would also disable
    the torch.func.grad that the derivative is traced from: it traced as 0.)"""
    device = torch.cuda.current_device() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    result = {}

    def run():
        try:
            if device is not None:
                torch.cuda.set_device(device)
            result["value"] = fn(*args)
        except BaseException as err:  # noqa: BLE001 - re-raised on the caller's thread
            result["error"] = err

    thread = threading.Thread(target=run, name="haloattn-mod-check")
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]
    return result["value"]


def _check(problem, mods) -> None:
    device = problem.device
    run_on = _check_device(problem)
    captured = [t.detach().to(run_on) for t in mods.tensors]
    for seed in (0, 1):
        points = _points(problem, seed)
        s, b, h, q, kv = points
        narrow = [t.to(device=run_on, dtype=torch.int32) for t in (b, h, q, kv)]
        s_run = s.to(run_on)
        tables = captured + [s_run] * (MAX_CAPTURED - len(captured))
        if problem.score_mod is not None:
            theirs, their_gradient = _user_scores(problem.score_mod, *points, device)
            ours, our_gradient = torch.empty(len(s), device=run_on), torch.empty(len(s), device=run_on)
            _run_points(_score_points, run_on, s_run, *narrow, ours, *tables, FN=mods.score, N=len(s))
            _run_points(_score_points, run_on, s_run, *narrow, our_gradient, *tables, FN=mods.score_grad, N=len(s))
            _disagreement("score_mod", ours.cpu(), theirs, points)
            _disagreement("score_mod's derivative", our_gradient.cpu(), their_gradient, points)
        if problem.mask_mod is not None:
            theirs = problem.mask_mod(*(t.to(device) for t in (b, h, q, kv)))
            theirs = torch.as_tensor(theirs).to(torch.bool).cpu().expand(len(s)).float()
            ours = torch.empty(len(s), dtype=torch.int8, device=run_on)
            _run_points(_mask_points, run_on, *narrow, ours, *tables, FN=mods.mask, N=len(s))
            _disagreement("mask_mod", ours.cpu().float(), theirs, points)
