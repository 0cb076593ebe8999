"""timm swin_tiny_patch4_window7_224, random init, stock against haloattn.integrations.timm.patch_swin:
training-step throughput (forward, backward, AdamW step) and inference throughput, bfloat16
autocast. Stock timm runs its default attention path (eager, unless TIMM_FUSED_ATTN enables SDPA);
``--fused`` also times stock with timm's SDPA path switched on. Medians of triton's do_bench.

End-to-end steps on a shared machine move by 10-15 % between runs (host load, clocks: three runs
of one tree gave stock training steps of 65.7-73.7 ms), so ``--rounds N`` times every model N times,
round-robin, and reports each model's median: the ratios then compare neighbours in time.

    python benchmarks/bench_swin_timm.py [--batch 128] [--fused] [--rounds 3] [--gpu-busy]
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import statistics

import torch
from timm.models import swin_transformer
from triton.testing import do_bench

from haloattn.integrations.timm import patch_swin


def training_step(model, batch):
    x = torch.randn(batch, 3, 224, 224, device="cuda")
    target = torch.randint(0, 1000, (batch,), device="cuda")
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(x), target)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return step


def throughput(model, batch, train):
    if train:
        step = training_step(model, batch)
    else:
        x = torch.randn(batch, 3, 224, 224, device="cuda")
        model.eval()

        @torch.no_grad()
        def step():
            with torch.autocast("cuda", dtype=torch.bfloat16):
                model(x)
    ms = do_bench(step, warmup=300, rep=1500, return_mode="median")
    return ms, batch * 1000.0 / ms


def gpu_busy_ms(model, batch, steps=5):
    """Kernel time per training step (sum of kernel durations from the profiler; one stream, so no
    overlap): against the step's wall time it tells a GPU-bound step (about equal) from one the
    host holds up (the GPU idles between launches for the difference)."""
    step = training_step(model, batch)
    step()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    return sum(e.self_device_time_total for e in prof.key_averages()) / steps / 1e3


@contextlib.contextmanager
def window_defaults(settings):
    """Within the block, triton_window launches with ``settings`` as its defaults (a config the
    caller passes still wins): for comparing default choices in a whole model, backward included."""
    from haloattn.backends.triton import fast_launch, window_launch

    original = window_launch._launch_config

    def launch_config(kind, launch, problem, device, config, *rest, **kw):
        return original(kind, launch, problem, device, {**settings, **(config or {})}, *rest, **kw)

    # Launch plans are built with the settings in force: none may outlive (or predate) the block.
    fast_launch.clear_plans()
    window_launch._launch_config = launch_config
    try:
        yield
    finally:
        window_launch._launch_config = original
        fast_launch.clear_plans()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--fused", action="store_true", help="also time stock timm with its SDPA path")
    parser.add_argument("--markdown", help="also write the table to this file")
    parser.add_argument("--rounds", type=int, default=1, help="time every model this many times, round-robin; "
                        "report medians")
    parser.add_argument("--compile", metavar="MODE",
                        help="torch.compile every model with this mode (e.g. reduce-overhead: CUDA graphs) "
                             "before timing; AdamW stays eager")
    parser.add_argument("--gpu-busy", action="store_true",
                        help="also report each model's kernel time per training step (torch profiler) "
                             "against its wall time: how much of a step the GPU waits for the host")
    parser.add_argument("--window-config", action="append", default=[], metavar="JSON",
                        help="also time patch_swin with these triton_window launch settings as its defaults "
                             "(e.g. '{\"forward_num_stages\": 2}'); repeatable")
    parser.add_argument("--skip-default", action="store_true",
                        help="time only the --window-config variants of patch_swin (a fresh process per variant)")
    args = parser.parse_args()
    torch.manual_seed(0)
    stock = swin_transformer.swin_tiny_patch4_window7_224(pretrained=False).cuda()
    variants = {"stock timm": stock}
    if args.fused:
        fused = copy.deepcopy(stock)
        for module in fused.modules():
            if isinstance(module, swin_transformer.WindowAttention):
                module.fused_attn = True
        variants["stock timm, fused_attn (SDPA)"] = fused
    if not args.skip_default:
        variants["haloattn patch_swin"] = patch_swin(copy.deepcopy(stock))
    settings_of = {}
    for settings in args.window_config:
        name = f"haloattn patch_swin, {settings}"
        variants[name] = patch_swin(copy.deepcopy(stock))
        settings_of[name] = json.loads(settings)

    if args.compile:
        variants = {name: torch.compile(model, mode=args.compile) for name, model in variants.items()}
    lines = [f"{torch.cuda.get_device_name()}, torch {torch.__version__}, batch {args.batch}, bf16 autocast, "
             f"medians of {args.rounds} round(s)" + (f", torch.compile mode={args.compile}" if args.compile else ""),
             "| model | train step (ms) | train img/s | inference (ms) | inference img/s |", "|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    timings = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, model in variants.items():
            with window_defaults(settings_of.get(name, {})):
                timings[name].append((throughput(model, args.batch, train=True)[0],
                                      throughput(model, args.batch, train=False)[0]))
            print(f"round {len(timings[name])}, {name}: train {timings[name][-1][0]:.1f} ms, "
                  f"inference {timings[name][-1][1]:.1f} ms", flush=True)
    results = {}
    for name, runs in timings.items():
        train_ms = statistics.median(t for t, _ in runs)
        infer_ms = statistics.median(i for _, i in runs)
        train_ips, infer_ips = args.batch * 1000.0 / train_ms, args.batch * 1000.0 / infer_ms
        results[name] = (train_ips, infer_ips)
        lines.append(f"| {name} | {train_ms:.1f} | {train_ips:.0f} | {infer_ms:.1f} | {infer_ips:.0f} |")
        print(lines[-1], flush=True)
    base_train, base_infer = results["stock timm"]
    lines.append("")
    for name, (ours_train, ours_infer) in results.items():
        if name.startswith("haloattn"):
            lines.append(f"{name} vs stock timm: training {ours_train / base_train:.2f}x, "
                         f"inference {ours_infer / base_infer:.2f}x")
            print(lines[-1], flush=True)
    if args.gpu_busy:
        lines += ["", "| model | train step wall (ms, median above) | kernel time per step (ms, profiler) | GPU idle |",
                  "|---|---|---|---|"]
        for name, model in variants.items():
            with window_defaults(settings_of.get(name, {})):
                busy = gpu_busy_ms(model, args.batch)
            wall = statistics.median(t for t, _ in timings[name])
            lines.append(f"| {name} | {wall:.1f} | {busy:.1f} | {max(0.0, 1 - busy / wall):.0%} |")
            print(lines[-1], flush=True)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
