"""Tensor descriptors against pointer loads for the forward's K/V on short walks (tiles.SHORT_WALK_STEPS).

Two tables, as RESULTS.md "Short walks read by pointer" reports them (forward, bf16, CUDA-graph
time, median of three interleaved rounds):

* ``--flip``: each problem's default config against the same config with ``tma`` flipped (the
  sweep that suggested the rule); where the default packs (batch, head) pairs by pointer, also
  descriptor loads with one pair a program (``tma_unpacked``);
* default (``--rule``): the default config against the one before the short-walk rule (descriptors
  wherever the head dim asks for them, one (batch, head) pair a program), outputs compared;
* ``--backward``: the backward (dQ and dK/dV kernels) with its default loads against the same
  with ``tma`` flipped in both (and dK/dV's ``wait_dk`` as the flipped loads would choose it),
  gradients compared: whether short walks want pointer loads in the backward too.

    python benchmarks/bench_short_walks.py [--flip | --backward] [--json FILE]
"""

from __future__ import annotations

import argparse
import json

import torch
from triton.testing import do_bench_cudagraph

from haloattn.backend import AttentionInputs
from haloattn.backends.triton import tiles
from haloattn.dispatch import DISPATCHER
from haloattn.problem import build_problem

# (batch, spatial, heads, head dim, window, options): blocked problems (stride == window) and
# small windows walking 1-4 key tiles, and longer walks as controls.
PROBLEMS = [
    (1, (128, 128), 16, 128, 16, dict(stride=16)),
    (1, (128, 128), 16, 64, 16, dict(stride=16)),
    (4, (64, 64), 16, 128, 8, dict(stride=8)),
    (4, (64, 64), 8, 64, 8, dict(stride=8)),
    (1, (128, 128), 16, 128, 32, dict(stride=32)),
    (2, (96, 96), 16, 128, 12, dict(stride=12)),
    (1, (16, 48, 48), 16, 128, (2, 8, 8), dict(stride=(2, 8, 8))),
    (1, (32768,), 16, 128, 256, dict(stride=256)),
    (1, (128, 128), 16, 128, 32, dict(stride=16)),
    (1, (128, 128), 16, 128, 31, {}),
    (8, (56, 56), 8, 128, 7, {}),
    (4, (96, 96), 8, 128, 13, {}),
    (2, (64, 64), 4, 256, 5, {}),
    (2, (16, 32, 32), 12, 128, (3, 5, 5), {}),
    (2, (8192,), 16, 128, 127, dict(causal=True)),
    (64, (28, 28), 8, 128, 7, dict(pattern="window")),
]


def interleaved_ms(runs: dict, rounds: int = 3) -> dict:
    """CUDA-graph ms of each ``runs[name]()``, median of ``rounds`` interleaved rounds."""
    times = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            torch.cuda.synchronize()
            times[name].append(do_bench_cudagraph(run, rep=40))
    return {name: sorted(t)[len(t) // 2] for name, t in times.items()}


def forward_ms(backend, problem, inputs, configs: dict) -> dict:
    return interleaved_ms({name: (lambda cfg=cfg: backend.forward(problem, inputs, cfg))
                           for name, cfg in configs.items()})


def backward_ms(backend, problem, inputs, configs: dict):
    """(interleaved ms per config of the backward's kernels for q, k and v, the largest difference
    between the two configs' gradients)."""
    out, lse = backend.forward(problem, inputs, next(iter(configs.values())))
    grad_out = torch.randn_like(out)
    needs = (True, True, True, False, False, False, False)

    def run(cfg):
        return backend.backward(problem, inputs, out, lse, grad_out, None, needs, cfg)

    ms = interleaved_ms({name: (lambda cfg=cfg: run(cfg)) for name, cfg in configs.items()})
    first, second = (run(cfg)[:3] for cfg in configs.values())
    diff = max((a.float() - b.float()).abs().max().item() for a, b in zip(first, second))
    return ms, diff


def flipped_backward(problem, config: dict) -> dict:
    tma = not config["dq"]["tma"]
    return dict(config, dq=dict(config["dq"], tma=tma),
                dkdv=dict(config["dkdv"], tma=tma, wait_dk=tiles.waits_for_dk(problem, tma)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flip", action="store_true", help="default against tma flipped, not against the old rule")
    parser.add_argument("--backward", action="store_true", help="the backward's loads flipped instead")
    parser.add_argument("--json")
    args = parser.parse_args()
    backend = DISPATCHER.get("triton")
    rows = []
    for batch, spatial, heads, head_dim, window, options in PROBLEMS:
        q, k, v = (torch.randn(batch, *spatial, heads, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        problem = build_problem(q, k, v, window, **options)
        inputs = AttentionInputs(q, k, v)
        new = tiles.default_config(problem)
        fwd = new["fwd"]
        if args.backward:
            other = flipped_backward(problem, new)
            row = {"batch": batch, "spatial": spatial, "head_dim": head_dim, "window": window, **options,
                   "bwd_tma": new["dq"]["tma"]}
            ms, diff = backward_ms(backend, problem, inputs, {"default": new, "flipped": other})
            row.update(max_diff=diff, default_ms=ms["default"], flipped_ms=ms["flipped"],
                       speedup=ms["flipped"] / ms["default"])
            rows.append(row)
            print(json.dumps(row), flush=True)
            continue
        if args.flip:
            other = dict(new, fwd=dict(fwd, tma=not fwd["tma"]))
        else:
            other = dict(new, fwd=dict(fwd, tma=tiles.descriptor_loads(problem), pack=1))
        row = {"batch": batch, "spatial": spatial, "head_dim": head_dim, "window": window, **options,
               "steps": round(tiles.steps_per_tile(problem, fwd["q"], fwd["kv"]), 2), "tma": fwd["tma"],
               "pack": fwd.get("pack", 1)}
        if other["fwd"] == fwd:
            row["unchanged"] = True
        else:
            reference, _ = backend.forward(problem, inputs, other)
            got, _ = backend.forward(problem, inputs, new)
            row["max_diff"] = (got.float() - reference.float()).abs().max().item()
            configs = {"default": new, "other": other}
            if args.flip and fwd.get("pack", 1) > 1 and not fwd["tma"]:
                configs["tma_unpacked"] = dict(new, fwd=dict(fwd, tma=True, pack=1))
            ms = forward_ms(backend, problem, inputs, configs)
            row.update(default_ms=ms["default"], other_ms=ms["other"], speedup=ms["other"] / ms["default"])
            if "tma_unpacked" in ms:
                row.update(tma_unpacked_ms=ms["tma_unpacked"],
                           tma_unpacked_speedup=ms["tma_unpacked"] / ms["default"])
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "flip": args.flip, "backward": args.backward,
                       "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
