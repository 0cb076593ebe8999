"""The ``haloattn`` command: ``info``, ``profile`` (the main job), ``tune`` and ``show``."""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from typing import List, Optional

import torch

from . import __version__, tuning
from .api import clear_caches
from .backend import AttentionInputs, checked_gradients, checked_outputs, on_device
from .dispatch import DISPATCHER
from .geometry import attended_pairs
from .problem import build_problem

DTYPES = {"float16": torch.float16, "fp16": torch.float16, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float32": torch.float32, "fp32": torch.float32, "float64": torch.float64, "fp64": torch.float64}


# -- argument parsing -----------------------------------------------------------------------------
class UsageError(Exception):
    """A bad option value found after parsing; main() prints it like argparse's own errors."""


def _ints(text: str) -> List[int]:
    # every part must be an int: "64x" or "x" is a typo, not a shorter grid
    try:
        return [int(t) for t in text.lower().replace(",", "x").split("x")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of ints like 64x64 or 7") from None


def _positive_ints(text: str) -> List[int]:
    values = _ints(text)
    if min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: every value must be >= 1")
    return values


def _int_at_least(minimum: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an int") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{text!r}: it must be >= {minimum}")
        return value
    return parse


_positive_int = _int_at_least(1)
_nonnegative_int = _int_at_least(0)


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}: it must be a finite number > 0")
    return value


def _kernel_size(text: str) -> List[int]:
    values = _positive_ints(text)
    if len(values) != 2:
        raise argparse.ArgumentTypeError(f"{text!r}: expected c_q x c_k, e.g. 6x11")
    return values


def _bools(text: str) -> List[bool]:
    table = {"1": True, "t": True, "true": True, "y": True, "0": False, "f": False, "false": False, "n": False}
    try:
        return [table[t] for t in text.lower().replace(",", "x").split("x")]
    except KeyError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of booleans like 1x0 or true") from None


def _per_axis(values: List, rank: int, name: str):
    if len(values) == 1:
        return values * rank
    if len(values) != rank:
        raise UsageError(f"argument --{name}: has {len(values)} values but --shape has {rank} axes; give 1 or {rank}")
    return values


def _device(text: Optional[str]) -> torch.device:
    """The --device, checked here: torch's own errors (an AssertionError for cuda on a CPU-only
    build) come from deep inside, and meta tensors hold no data to time or check."""
    if text is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(text)
        if device.type == "meta":
            raise ValueError("meta tensors hold no data to run")
        torch.empty(1, device=device)
    except Exception as exc:
        raise UsageError(f"argument --device: {text!r} cannot be used here ({type(exc).__name__}: {exc}); "
                         f"allowed: cpu{', cuda' if torch.cuda.is_available() else ''}") from None
    return device


def _problem_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--shape", type=_positive_ints, default=[64, 64],
                        help="token grid, e.g. 64x64 (default) or 32768 or 16x48x48")
    parser.add_argument("--window", type=_positive_ints, default=[7], help="window per axis (default 7)")
    parser.add_argument("--stride", type=_positive_ints, default=[1], help="per axis (default 1)")
    parser.add_argument("--dilation", type=_positive_ints, default=[1], help="per axis (default 1)")
    parser.add_argument("--causal", type=_bools, default=[False], help="per axis, e.g. 1x0")
    parser.add_argument("--pattern", choices=("neighborhood", "window"), default="neighborhood")
    parser.add_argument("--shift", type=_ints, default=[0], help="window pattern only")
    parser.add_argument("--batch", type=_positive_int, default=2)
    parser.add_argument("--heads", type=_positive_int, default=4)
    parser.add_argument("--kv-heads", type=_positive_int, default=None,
                        help="GQA/MQA key/value heads (default: --heads)")
    parser.add_argument("--head-dim", type=_positive_int, default=32)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default=None, help="default: bfloat16 on CUDA, float32 on CPU")
    parser.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    parser.add_argument("--seed", type=int, default=0)
    # the features that change which backends run and what they compute
    parser.add_argument("--rpb", action="store_true", help="add a relative position bias table")
    parser.add_argument("--softcap", type=_positive_float, default=None, help="softcap * tanh(s / softcap)")
    parser.add_argument("--extra-tokens", type=_nonnegative_int, default=0,
                        help="additional keys/values every query attends to (default 0)")
    parser.add_argument("--kq-conv", type=_kernel_size, default=None, metavar="CQxCK",
                        help="Multi-Token-Attention key-query convolution, e.g. 6x11 (1-D grids)")


def _make_inputs(args):
    """(AttentionInputs, options) of the problem the arguments describe, random normal tensors."""
    device = _device(args.device)
    dtype = DTYPES[args.dtype] if args.dtype else (torch.bfloat16 if device.type == "cuda" else torch.float32)
    rank = len(args.shape)
    kv_heads = args.kv_heads or args.heads
    gen = torch.Generator(device="cpu").manual_seed(args.seed)

    def randn(*shape, scale=1.0, table=False):
        # learned tables stay float32 beside 16-bit tokens, as under autocast
        return (scale * torch.randn(*shape, generator=gen, dtype=torch.float32)).to(
            device=device, dtype=torch.float32 if table and dtype != torch.float64 else dtype)

    window = _per_axis(args.window, rank, "window")
    q = randn(args.batch, *args.shape, args.heads, args.head_dim)
    k = randn(args.batch, *args.shape, kv_heads, args.head_dim)
    v = randn(args.batch, *args.shape, kv_heads, args.head_dim)
    rpb = randn(args.heads, *(2 * w - 1 for w in window), scale=0.5, table=True) if args.rpb else None
    kq_conv = randn(args.heads, *args.kq_conv, scale=0.3, table=True) if args.kq_conv else None
    extra_keys = extra_values = None
    if args.extra_tokens:
        extra_keys = randn(args.batch, args.extra_tokens, kv_heads, args.head_dim)
        extra_values = randn(args.batch, args.extra_tokens, kv_heads, args.head_dim)
    options = dict(
        window=window,
        stride=_per_axis(args.stride, rank, "stride"),
        dilation=_per_axis(args.dilation, rank, "dilation"),
        causal=_per_axis(args.causal, rank, "causal"),
        pattern=args.pattern,
        shift=_per_axis(args.shift, rank, "shift"),
        softcap=args.softcap,
    )
    return AttentionInputs(q, k, v, rpb, kq_conv, extra_keys, extra_values), options


def _build_problem(inputs: AttentionInputs, options):
    """build_problem's ValueError names the bad value and what is allowed: show it as a usage
    error (a window larger than the grid, a stride above the window), not as a traceback."""
    try:
        return build_problem(inputs.query, inputs.key, inputs.value, rpb=inputs.rpb, kq_conv=inputs.kq_conv,
                             additional_keys=inputs.additional_keys, additional_values=inputs.additional_values,
                             **options)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


# -- info -------------------------------------------------------------------------------------------
def _cache_summary(device: torch.device) -> str:
    path = tuning.cache_path(device)
    if os.path.exists(tuning.cache_dir()) and not os.path.isdir(tuning.cache_dir()):
        return f"{path} (unusable: {tuning.cache_dir()} is not a directory; set {tuning.CACHE_DIR_ENV})"
    if not os.path.exists(path):
        return f"{path} (empty: no file yet)"
    entries = len(tuning.tuning_file(device).entries)
    return f"{path} ({entries} entries, {os.path.getsize(path)} bytes)"


def cmd_info(args) -> int:
    try:
        import triton

        triton_version = triton.__version__
    except ImportError as exc:
        triton_version = f"not installed ({exc})"
    print(f"haloattn {__version__}")
    print(f"python   {platform.python_version()} ({sys.executable})")
    print(f"torch    {torch.__version__} (CUDA {torch.version.cuda or 'none'})")
    print(f"triton   {triton_version}")
    devices = [torch.device("cpu")]
    print("devices:")
    # platform.processor() is empty on many Linux machines: leave it out rather than print a gap.
    processor = " ".join(part for part in (platform.machine(), platform.processor()) if part)
    print(f"  cpu: {processor}, {os.cpu_count()} cores")
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            cap = torch.cuda.get_device_capability(i)
            print(f"  cuda:{i}: {torch.cuda.get_device_name(i)}, capability {cap[0]}.{cap[1]}")
            devices.append(torch.device("cuda", i))
    else:
        print("  cuda: none visible to torch")
    print("backends (priority order):")
    for backend in DISPATCHER.backends():
        reasons = DISPATCHER.unavailable_reasons(backend)  # a plugin's check that raises is a reason too
        verdict = "available" if not reasons else "unavailable: " + "; ".join(reasons)
        print(f"  {backend.name:<14} priority {backend.priority:>4}  {verdict}")
        if backend.description:
            print(f"  {'':<14} {backend.description}")
    for name, error in DISPATCHER.plugin_errors.items():
        print(f"  {name:<14} plugin failed to load: {error}")
    print("tuning cache:")
    for device in devices:
        print(f"  {device}: {_cache_summary(device)}")
    print(f"  autotune {'on' if tuning.autotune_enabled() else 'off'} ({tuning.AUTOTUNE_ENV}=1 turns it on)")
    return 0


# -- profile ----------------------------------------------------------------------------------------
def _rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    diff = (x.double() - ref.double()).norm().item()
    denom = ref.double().norm().item()
    if x.isnan().any():
        return float("nan")
    return diff / denom if denom else diff


def cmd_profile(args) -> int:
    inputs, options = _make_inputs(args)
    problem = _build_problem(inputs, options)
    pairs = attended_pairs(problem.axes, problem.pattern) * problem.batch * problem.heads
    fwd_flops = 2 * pairs * (problem.head_dim + problem.value_dim)
    print(f"problem: {problem.describe()}")
    print(f"attended pairs: {pairs:,} ({fwd_flops / 1e9:.3f} GFLOP forward)")

    reference = DISPATCHER.get("reference")
    exact = AttentionInputs(*(None if t is None else t.detach().double() for t in inputs))
    ref_problem = _build_problem(exact, options)
    ref_out, ref_lse = reference.forward(ref_problem, exact)
    grad_out = torch.randn_like(ref_out)
    if args.jvp:
        tangents = AttentionInputs(*(torch.randn_like(t) for t in inputs[:3]))
        exact_tangents = AttentionInputs(*(t.double() for t in tangents[:3]))
        ref_tangent, _ = reference.jvp(ref_problem, exact, exact_tangents, ref_out, ref_lse)

    rows, skipped, failed = [], [], []
    for backend in DISPATCHER.backends():
        verdict = DISPATCHER.verdict(backend, problem)
        if not verdict.can_run:
            skipped.append((backend.name, verdict.reasons))
            continue
        # a backend that raises (or breaks the forward's contract) is reported and the others still
        # run: a plugin's bug used to end the command with its traceback, and every other row with it
        try:
            with on_device(problem.device):  # as a call runs it: the inputs' device current
                rows.append(_profile_row(backend, problem, inputs, args, fwd_flops, ref_out, grad_out,
                                         tangents if args.jvp else None, ref_tangent if args.jvp else None))
        except Exception as exc:
            failed.append((backend.name, f"{type(exc).__name__}: {exc}"))

    header = ["backend", "fwd ms", "fwd TFLOP/s"]
    if args.backward:
        header += ["fwd+bwd ms", "fwd+bwd TFLOP/s"]
    header.append("rel err vs fp64 reference")
    if args.jvp:
        header += ["jvp ms", "jvp rel err"]
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(header)]
    print("  ".join(h.ljust(w) for h, w in zip(header, widths)))
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)))
    for name, error in failed:
        print(f"failed: {name}: {error}")
    for name, reasons in skipped:
        print(f"not run: {name}: {'; '.join(reasons)}")
    return 1 if failed else 0


def _profile_row(backend, problem, inputs, args, fwd_flops, ref_out, grad_out, tangents, ref_tangent) -> list:
    """One backend's row of ``haloattn profile``: its times and its errors against the reference."""
    out, lse = checked_outputs(backend, inputs, backend.forward(problem, inputs, None))
    error = _rel(out, ref_out)
    fwd_ms = tuning.time_call(lambda: backend.forward(problem, inputs, None), problem.device, repeat=args.repeat)
    row = [backend.name, f"{fwd_ms:.3f}", f"{fwd_flops / fwd_ms / 1e9:.4g}"]
    if args.backward:
        go = grad_out.to(out.dtype)
        needs = tuple(t is not None for t in inputs)  # the learned tables' gradients too

        def step():
            o, l = backend.forward(problem, inputs, None)
            return backend.backward(problem, inputs, o, l, go, None, needs, None)

        checked_gradients(backend, inputs, step(), needs)
        both_ms = tuning.time_call(step, problem.device, repeat=args.repeat)
        row += [f"{both_ms:.3f}", f"{3.5 * fwd_flops / both_ms / 1e9:.4g}"]
    row.append(f"{error:.2e}")
    if args.jvp:
        row += _jvp_columns(backend, problem, inputs, tangents, out, lse, ref_tangent, args.repeat)
    return row


def _jvp_columns(backend, problem, inputs, tangents, out, lse, ref_tangent, repeat) -> list:
    """The JVP's time (given the forward's out and lse, tangents of q, k and v) and its output
    tangent's error against the reference's in float64; '-' for a backend without a rule."""
    if not DISPATCHER.verdict(backend, problem, needs_jvp=True).can_run:
        return ["-", "no rule"]
    tangent, _ = backend.jvp(problem, inputs, tangents, out, lse, None)
    ms = tuning.time_call(lambda: backend.jvp(problem, inputs, tangents, out, lse, None), problem.device,
                          repeat=repeat)
    return [f"{ms:.3f}", f"{_rel(tangent, ref_tangent):.2e}"]


# -- tune / show ------------------------------------------------------------------------------------
def cmd_tune(args) -> int:
    device = _device(args.device)
    for option, path in (("--export", args.export_path), ("--import", args.import_path)):
        if path == "":  # an empty path is falsy: it would silently tune instead
            raise UsageError(f"argument {option}: expected a file path, got ''")
    if args.export_path is not None:
        try:
            n = tuning.export_cache(device, args.export_path)
        except OSError as exc:
            raise UsageError(f"argument --export: cannot write {args.export_path!r} ({exc})") from None
        print(f"exported {n} entries to {args.export_path}")
        return 0
    if args.import_path is not None:
        try:
            n = tuning.import_cache(device, args.import_path)
        except ValueError as exc:
            raise UsageError(f"argument --import: {exc}") from None
        clear_caches()
        print(f"imported {n} entries from {args.import_path}")
        return 0
    inputs, options = _make_inputs(args)
    problem = _build_problem(inputs, options)
    verdicts = {b.name: DISPATCHER.verdict(b, problem) for b in DISPATCHER.backends()}
    candidates = [b for b in DISPATCHER.backends() if verdicts[b.name].can_run]
    if not candidates:
        raise UsageError(f"no installed backend can run {problem.describe()}: " + " | ".join(
            f"{name}: {'; '.join(v.reasons)}" for name, v in verdicts.items()))
    backend, config = tuning.autotune(problem, candidates, inputs, args.backward)
    entry = tuning.cached_entry(problem, args.backward)
    defaults = set(entry.get("defaults", {}).values())

    def listing(timings):
        for label, ms in sorted(timings.items(), key=lambda kv: kv[1]):
            print(f"  {ms:10.3f} ms  {label}{'  (default)' if label in defaults else ''}")

    print(f"problem: {problem.describe()}")
    print("screened (every candidate, a few calls each):")
    listing(entry["candidates_ms"])
    finalists = entry.get("finalists_ms") or {}
    if len(finalists) > 1:
        print(f"re-timed (median of {tuning.ROUNDS} interleaved rounds):")
        listing(finalists)
    default_label = entry.get("defaults", {}).get(backend.name)
    # the winner's backend's default is always re-timed; against itself the ratio says nothing
    if default_label in finalists and len(finalists) > 1:
        print(f"{backend.name}'s default config takes {finalists[default_label] / entry['ms']:.2f}x the winner's time")
    for name, verdict in verdicts.items():  # on a CPU that is every fast backend: say why
        if not verdict.can_run:
            print(f"not tuned: {name}: {'; '.join(verdict.reasons)}")
    stored = tuning.tuning_file(problem.device)
    if stored.write_error:
        print(f"haloattn tune: error: winner {backend.name} not stored: cannot write {stored.path} "
              f"({stored.write_error}); set {tuning.CACHE_DIR_ENV} to a writable directory", file=sys.stderr)
        return 1
    print(f"winner: {backend.name}{' ' + json.dumps(config) if config else ''} -> {stored.path}")
    clear_caches()
    return 0


def cmd_show(args) -> int:
    device = _device(args.device)
    tf = tuning.tuning_file(device)
    print(f"{tf.path}: {len(tf.entries)} entries")
    print(json.dumps(tf.metadata, indent=1))
    for signature, entry in sorted(tf.entries.items()):
        print(f"{signature}\n  -> {entry['backend']} {json.dumps(entry.get('config'))} {entry.get('ms')} ms")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="haloattn", description="Fast local attention for PyTorch.")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="versions, devices, backends and why each can or cannot run, tuning cache")
    profile = sub.add_parser("profile", help="time every backend that can run a problem and check it against the reference")
    _problem_arguments(profile)
    profile.add_argument("--backward", action="store_true", help="also time forward+backward")
    profile.add_argument("--jvp", action="store_true",
                         help="also time forward-mode AD (tangents of q, k, v) where a backend has a rule")
    profile.add_argument("--repeat", type=_positive_int, default=10, help="timed repetitions (median reported)")
    tune = sub.add_parser("tune", help="autotune one problem into the on-disk cache, or export/import the cache")
    _problem_arguments(tune)
    tune.add_argument("--backward", action="store_true", help="tune forward+backward (for training)")
    # one action per call: with both, one of them used to be dropped without a word
    move = tune.add_mutually_exclusive_group()
    move.add_argument("--export", dest="export_path", metavar="PATH",
                      help="write this device's cache to PATH (problem options are not used)")
    move.add_argument("--import", dest="import_path", metavar="PATH",
                      help="merge an exported cache into this device's (problem options are not used)")
    show = sub.add_parser("show", help="print the tuning cache of a device")
    show.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    handler = {"info": cmd_info, "profile": cmd_profile, "tune": cmd_tune, "show": cmd_show}[args.command]
    try:
        return handler(args)
    except UsageError as exc:  # exit status 2 and this form, as argparse's own errors
        print(f"haloattn {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
