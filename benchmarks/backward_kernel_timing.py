"""The backward's two kernels timed apart on several configs of one problem, for the tile benches
(bench_float32_backward_tiles.py, bench_wide_backward_tiles.py).

Per config: the dQ kernel alone (dQ asked for) and the dK/dV kernel alone (dK, dV asked for), as
CUDA-graph medians (device time), after checking its gradients against the first config's, and
the first config's against the float64 reference.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import torch
from triton.testing import do_bench_cudagraph

import haloattn
from haloattn.backend import AttentionInputs
from haloattn.backends.triton import launch, tiles
from haloattn.problem import build_problem

DQ_ONLY = (True, False, False, False, False, False, False)
DKDV_ONLY = (False, True, True, False, False, False, False)


def rel(a, b):
    """Norm-wise relative error of ``a`` against the float64 ``b``."""
    return ((a.double() - b).norm() / b.norm()).item()


def time_backward_kernels(row: dict, problem, inputs, out, lse, go, configs, reference, timed: bool = True,
                          rep: int = 50) -> dict:
    """Into ``row``, per (label, config) of ``configs``: "<label> dq ms", "<label> dkdv ms",
    "<label> error" (its gradients against the first config's), "<label> tiles"; and "default
    error vs float64" (the first config's against ``reference``, the float64 dQ, dK, dV).
    A config whose kernels do not build is recorded as "<label> failed". Untimed (``timed``
    false) each config only runs once, which compiles its kernels."""
    base_grads = None
    for label, cfg in configs:
        try:
            dq = launch.backward(problem, inputs, out, lse, go, None, DQ_ONLY, cfg)[0]
            dk, dv = launch.backward(problem, inputs, out, lse, go, None, DKDV_ONLY, cfg)[1:3]
        except Exception as error:  # a variant that does not build (shared memory, registers)
            row[f"{label} failed"] = str(error).splitlines()[0][:200]
            continue
        if not timed:
            continue
        grads = (dq, dk, dv)
        if base_grads is None:
            base_grads = grads
            row["default error vs float64"] = max(rel(g, r) for g, r in zip(grads, reference))
        row[f"{label} error"] = max(rel(g, b.double()) for g, b in zip(grads, base_grads))
        row[f"{label} tiles"] = f"{cfg['dq']['q']}/{cfg['dq']['kv']} {cfg['dq']['warps']}w"
        for part, needs in (("dq", DQ_ONLY), ("dkdv", DKDV_ONLY)):
            row[f"{label} {part} ms"] = do_bench_cudagraph(
                lambda: launch.backward(problem, inputs, out, lse, go, None, needs, cfg), rep=rep,
                return_mode="median")
    return row


def time_backward_configs(name: str, problem, inputs, go, window, options, configs, timed: bool = True,
                          rep: int = 50) -> dict:
    """One problem's row: the first config's forward (its output and LSE feed every backward),
    then time_backward_kernels on ``configs`` ((label, config) pairs, the default first), and the
    default's forward time. ``inputs`` hold the q, k, v the float64 reference gradients come from
    (with ``go``, ``window`` and ``options``)."""
    default = configs[0][1]
    out, lse = launch.forward(problem, inputs, default)
    row = {"problem": name, "default dq": default["dq"], "default dkdv": default["dkdv"]}
    reference = None
    if timed:
        leaves = [t.double().requires_grad_() for t in (inputs.query, inputs.key, inputs.value)]
        haloattn.attention(*leaves, window, backend="reference", **options).backward(go.double())
        reference = [t.grad for t in leaves]
    time_backward_kernels(row, problem, inputs, out, lse, go, configs, reference, timed, rep)
    if timed:
        row["forward ms"] = do_bench_cudagraph(lambda: launch.forward(problem, inputs, default), rep=rep,
                                               return_mode="median")
    return row


def kernel_cells(row: dict) -> dict:
    """A timed row for the benches' tables: "dq" and "dkdv" (every config's ms, "label ms; ..."),
    "default" (the default's dQ + dK/dV ms) and "best" (the fastest dQ plus the fastest dK/dV)."""
    labels = [key[:-len(" dq ms")] for key in row if key.endswith(" dq ms")]
    cells = {part: "; ".join(f"{label} {row[f'{label} {part} ms']:.3f}" for label in labels) for part in ("dq", "dkdv")}
    best = sum(min(row[f"{label} {part} ms"] for label in labels) for part in ("dq", "dkdv"))
    return dict(cells, default=row["default dq ms"] + row["default dkdv ms"], best=best)


def compile_in_workers(script: str, jobs, workers: int) -> int:
    """Run ``script --one JOB`` for every job, ``workers`` processes at a time (each compiles its
    kernels into Triton's cache, so the timed run after them compiles nothing); the worst exit
    status."""
    jobs, running, status = list(jobs), [], 0
    while jobs or running:
        while jobs and len(running) < workers:
            running.append(subprocess.Popen([sys.executable, script, "--one", jobs.pop(0)]))
        running[0].wait()
        status = max(status, running.pop(0).returncode)
    return status


def default_without(flag: str, problem):
    """tiles.default_config(problem) with the rule that ``tiles.<flag>`` switches turned off:
    the config before that rule, for a bench to time beside the default."""
    setattr(tiles, flag, False)
    tiles.default_config.cache_clear()
    try:
        return tiles.default_config(problem)
    finally:
        setattr(tiles, flag, True)
        tiles.default_config.cache_clear()


def random_problem(batch, spatial, window, options, D, heads, kv_heads, dtype):
    """(problem, inputs, grad_out) of a bench row, seeded: every process draws the same tensors."""
    torch.manual_seed(0)
    q = torch.randn(batch, *spatial, heads, D, device="cuda", dtype=dtype)
    k, v = (torch.randn(batch, *spatial, kv_heads, D, device="cuda", dtype=dtype) for _ in range(2))
    return build_problem(q, k, v, window, **options), AttentionInputs(q, k, v), torch.randn_like(q)


def bench_main(doc: str, script: str, problems, run_problem, config_count, table) -> None:
    """The command line of the tile benches: ``--only``, ``--rule`` (the default and the config
    before the bench's rule only), ``--json``, ``--compile-only`` (every config run once, untimed,
    one process per problem and config, ``--workers`` at a time). ``run_problem(*problems[i],
    timed=, only_config=, rule=)`` gives a row, ``config_count(i, rule)`` its number of configs,
    ``table(rows)`` the markdown printed at the end."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json")
    parser.add_argument("--only", default="", help="comma list of problem indices")
    parser.add_argument("--compile-only", action="store_true")
    parser.add_argument("--workers", type=int, default=14)
    parser.add_argument("--rule", action="store_true", help="time the default and the config before the rule only")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a compile-only worker: "problem:config:rule"
    args = parser.parse_args()
    only = [int(i) for i in args.only.split(",") if i] or list(range(len(problems)))
    if args.one is not None:
        problem, config, rule = (int(part) for part in args.one.split(":"))
        run_problem(*problems[problem], timed=False, only_config=config, rule=bool(rule))
        return
    if args.compile_only:
        jobs = [f"{i}:{c}:{int(args.rule)}" for i in only for c in range(config_count(i, args.rule))]
        sys.exit(compile_in_workers(script, jobs, args.workers))
    rows = []
    for i in only:
        rows.append(run_problem(*problems[i], rule=args.rule))
        print(json.dumps(rows[-1]), flush=True)
        torch.cuda.empty_cache()
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1)
    print(table(rows))
