"""Times the reference backend on a CPU: forward, and forward + backward, on a few problems.

    .venv/bin/python benchmarks/bench_reference_cpu.py [--repeat 5] [--compare DIR] [--only NAME]

``--compare DIR`` also times a copy of ``backends/reference`` kept in DIR (a package directory
holding attend.py and blocks.py, e.g. the code before a change), alternating the two in the same
process so both see the same machine state. Effective GFLOP/s: forward ``4 * B * H * D * pairs``
(D_v = D here), forward + backward 3.5x that (the backward counted as 2.5 forwards), as
``haloattn profile`` counts.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path

import torch

import haloattn
from haloattn.backends.reference import plugin
from haloattn.geometry import attended_pairs
from haloattn.problem import build_problem


def _problems():
    g = torch.Generator().manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, generator=g)

    def qkv(B, spatial, H, D):
        return [randn(B, *spatial, H, D) for _ in range(3)]

    return [
        ("demo 2-D 64x64 w7 B2 H4 D32", qkv(2, (64, 64), 4, 32), dict(window=7)),
        ("1-D 4096 w127 B1 H4 D64", qkv(1, (4096,), 4, 64), dict(window=127)),
        ("2-D 64x64 w13 rpb B1 H4 D32", qkv(1, (64, 64), 4, 32), dict(window=13, rpb=randn(4, 25, 25))),
        ("3-D 8x16x16 w3x5x5 B1 H2 D32", qkv(1, (8, 16, 16), 2, 32), dict(window=(3, 5, 5))),
        (
            "2-D 32x32 w7 score_mod B1 H4 D32",
            qkv(1, (32, 32), 4, 32),
            dict(window=7, score_mod=lambda s, b, h, qi, ki: s + 0.01 * (qi - ki).float()),
        ),
        # Multi-Token Attention's kernel size (c_q 6, c_k 11)
        ("1-D 4096 w127 kq_conv 6x11 B1 H4 D64", qkv(1, (4096,), 4, 64), dict(window=127, kq_conv=0.1 * randn(4, 6, 11))),
        (
            "1-D 2048 w255 causal kq_conv 6x11 B1 H4 D64",
            qkv(1, (2048,), 4, 64),
            dict(window=255, causal=True, kq_conv=0.1 * randn(4, 6, 11)),
        ),
    ]


def _load_copy(directory: str):
    """Import DIR/attend.py as a package module (its relative ``.blocks`` import included)."""
    path = Path(directory).resolve()
    name = "_reference_copy"
    spec = importlib.util.spec_from_file_location(name, path / "__init__.py", submodule_search_locations=[str(path)])
    package = importlib.util.module_from_spec(spec)
    sys.modules[name] = package
    spec.loader.exec_module(package)
    module = importlib.import_module(name + ".attend")

    class Adapter:  # older copies' backward takes no out/lse
        forward = staticmethod(module.forward)

        @staticmethod
        def backward(*args, out=None, lse=None):
            try:
                return module.backward(*args, out=out, lse=lse)
            except TypeError:
                return module.backward(*args)

    return Adapter


def _runs(tensors, options):
    """(forward, forward + backward) callables for one problem."""
    q, k, v = tensors
    extra = {n: t for n, t in options.items() if torch.is_tensor(t)}

    def fwd():
        with torch.no_grad():
            haloattn.attention(q, k, v, backend="reference", **options)

    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    grad_extra = {n: t.detach().clone().requires_grad_(True) for n, t in extra.items()}
    grad_out = torch.randn_like(v)

    def both():
        out = haloattn.attention(*leaves, backend="reference", **{**options, **grad_extra})
        out.backward(grad_out)
        for t in (*leaves, *grad_extra.values()):
            t.grad = None

    return fwd, both


def _ms(fn):
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--compare", default=None, help="directory with another copy of the reference backend")
    parser.add_argument("--only", default=None, help="run problems whose name contains this")
    parser.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (default: torch's)")
    args = parser.parse_args(argv)

    if args.threads:
        torch.set_num_threads(args.threads)
    current = plugin.attend
    impls = [("current", current)]
    if args.compare:
        impls.insert(0, ("compare", _load_copy(args.compare)))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.repeat} runs each "
          "(alternating the codes), median (min)")
    print("| problem | code | fwd ms | fwd GFLOP/s | fwd+bwd ms | fwd+bwd GFLOP/s |")
    print("|" + "---|" * 6)
    for name, tensors, options in _problems():
        if args.only and args.only not in name:
            continue
        q, k, v = tensors
        problem = build_problem(q, k, v, **options)
        pairs = attended_pairs(problem.axes, problem.pattern) * problem.batch * problem.heads
        flops = 2 * pairs * (problem.head_dim + problem.value_dim)
        runs = {label: _runs(tensors, options) for label, _ in impls}
        times = {label: ([], []) for label, _ in impls}
        for r in range(args.repeat + 1):  # the first round warms up
            for label, module in impls:
                plugin.attend = module
                try:
                    for fn, out in zip(runs[label], times[label]):
                        t = _ms(fn)
                        if r:
                            out.append(t)
                finally:
                    plugin.attend = current
        for label, _ in impls:
            (f_med, f_min), (b_med, b_min) = ((statistics.median(t), min(t)) for t in times[label])
            print(
                f"| {name} | {label} | {f_med:.1f} ({f_min:.1f}) | {flops / f_med / 1e6:.1f} "
                f"| {b_med:.1f} ({b_min:.1f}) | {3.5 * flops / b_med / 1e6:.1f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
