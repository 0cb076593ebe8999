"""Neighbourhood attention on one GPU: haloattn backend ``triton`` against FlexAttention (compiled,
with a block mask built for the same neighbourhood) and dense cuDNN SDPA over the same tokens.
Flex gets the tokens permuted into 128-token tiles and a block mask built exactly, without a
compile, from haloattn.geometry; its mask_mod only looks up precomputed per-token tables (see the
FlexAttention section). ``--check-flex`` checks that mask pair by pair against haloattn's rule
and runs Flex end to end on small problems, timing nothing (a CPU is enough).

Effective TFLOP/s count attended pairs only (exact, from haloattn.geometry): forward
4 * B * H * D * pairs, forward+backward 3.5x that; dense SDPA counts every pair. Efficiency =
effective TFLOP/s of a method / dense cuDNN TFLOP/s in the same run. Every method is timed twice:
``triton.testing.do_bench`` medians (host time included: a call whose host side outlasts its
kernels is timed by the host) and medians of CUDA-graph replays (device time alone, the
``graph`` columns; a call that cannot be captured gets no graph figure and says why). A forward +
backward call returns its gradients (gradient_calls.forward_backward) in both methods; CUDA-graph
figures before 2026-12-05 added each replay's gradients into ``.grad`` as well. ``--tune 0,1`` also times every tuning candidate (forward
and backward kernels) of those problems and reports how far the heuristic default is from the best.
Blocked problems (stride == window dividing every axis) are also timed as what they are, a batch of
short dense attentions: SDPA's cuDNN and Flash kernels over the windows gathered into contiguous
sequences (``time_dense_windows``), a second table beside the first.

FlexAttention is bounded per problem, so one stalled compile costs one row ("timeout"), not the
run. It runs in worker processes of this script: first a compile phase, one worker per problem in
parallel (each compiles haloattn's kernels, the tune candidates and Flex's forward and backward
once, filling the Triton and Inductor caches on disk), under ``--flex-compile-timeout``; then,
after haloattn and cuDNN are timed in this process with the CPU quiet again, one timing worker
walks the problems whose compile finished, each under ``--flex-timeout`` seconds (a stalled
worker is killed and a new one takes the remaining problems). ``--flex-compile-only FILE`` runs
the compile phase alone and writes its outcome to FILE, so a driver script can overlap it with
other work and hand FILE to the timing run through ``--flex-compile-status FILE``.

    python benchmarks/bench_neighborhood.py [--tune 0,1,5] [--no-flex] [--json FILE] [--markdown FILE]
    python benchmarks/bench_neighborhood.py --check-flex [cpu|cuda] [--only 0,4]
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import signal
import subprocess
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench, do_bench_cudagraph

import haloattn
from haloattn.geometry import attends, key_range
from haloattn.problem import build_problem

from gradient_calls import forward_backward

# name: (spatial, window, options, head_dim)
PROBLEMS = [
    ("1-D 32768, window 2047", (32768,), 2047, {}, 128),
    ("2-D 128x128, 31x31", (128, 128), 31, {}, 128),
    ("2-D 128x128, 63x63", (128, 128), 63, {}, 128),
    ("2-D 128x128, 31x31 dilation 2", (128, 128), 31, {"dilation": 2}, 128),
    ("2-D 128x128, 31x31 causal axis 0", (128, 128), 31, {"causal": (True, False)}, 128),
    ("3-D 16x48x48, 7x15x15", (16, 48, 48), (7, 15, 15), {}, 128),
    ("3-D 16x48x48, 7x15x15 causal time", (16, 48, 48), (7, 15, 15), {"causal": (True, False, False)}, 128),
    ("2-D 128x128, 32x32 stride 16", (128, 128), 32, {"stride": 16}, 128),
    ("2-D 128x128, 16x16 stride 16", (128, 128), 16, {"stride": 16}, 128),
    ("2-D 128x128, 31x31, D=64", (128, 128), 31, {}, 64),
]
BATCH, HEADS = 1, 16


def attended_pairs(problem) -> int:
    """Exact attended (query, key) pairs: the pattern is an AND over axes, so pairs factor."""
    pairs = 1
    for axis in problem.axes:
        i = torch.arange(axis.length)
        _, lo, hi = key_range(axis, problem.pattern, i)
        pairs *= int((hi - lo).sum())
    return pairs * problem.batch


def bench(fn) -> float:
    return do_bench(fn, warmup=10, rep=60, return_mode="median")


def bench_graph(row, key, fn):
    """Median ms of CUDA-graph replays of ``fn`` into ``row[key]``; if the capture fails, why into
    ``row[key + "_failure"]`` (the first error of the chain says what was not capturable)."""
    try:
        torch.cuda.synchronize()  # do_bench_cudagraph's side stream does not wait for ours
        row[key] = do_bench_cudagraph(fn, rep=60, return_mode="median")
    except Exception as exc:  # whatever broke the capture is reported, never hidden
        first = exc
        while first.__context__ is not None:
            first = first.__context__
        row[key + "_failure"] = " ".join(f"{type(first).__name__}: {first}".split())[:200]
        print(f"CUDA-graph capture failed for {key}: {row[key + '_failure']}", file=sys.stderr, flush=True)
        torch.cuda.synchronize()


# ---- FlexAttention, set up as haloattn's `flex` backend sets it up (backends/flex, one source of
# truth): tokens gathered (not timed) into 128-token tiles that are boxes of the grid, 8x16 in
# 2-D, 2x8x8 in 3-D, 128 in 1-D, each inside one dilation group, so a dilated problem gets full
# blocks as an undilated one does; the mask_mod only looks up per-position tables (code ranges
# from haloattn.geometry), and the BlockMask is built exactly without a compile. Here Flex is
# called directly on the tiled tensors, so its rows time Flex's kernels alone. (A first version's
# mask_mod redid the window arithmetic, divisions and clamps included: compiled create_block_mask
# plus Flex forward and backward then exceeded 200 s for four 2-D problems on an H100.)
# The mask_mod's code depends on the rank alone, so problems of one rank, N and D share Flex's
# compiled kernels.


def flex_layout(problem):
    """The token order Flex gets (backends/flex/token_order.py)."""
    from haloattn.backends.flex.token_order import TokenOrder

    return TokenOrder(problem)


def to_tiles(t, layout):
    """[B, *spatial, H, D] -> [B, H, positions, D] in the layout's order, contiguous as a Flex
    user's tensors would be."""
    gathered = t.reshape(t.shape[0], -1, *t.shape[-2:]).index_select(1, layout.source.to(t.device))
    return gathered.transpose(1, 2).contiguous()


def from_tiles(t, layout):
    """Inverse of to_tiles: [B, H, positions, D] -> [B, *spatial, H, D]."""
    B, H, D = t.shape[0], t.shape[1], t.shape[-1]
    grid = t.transpose(1, 2).index_select(1, layout.place.to(t.device))
    return grid.reshape(B, *layout.spatial, H, D)


def flex_setup(problem, device):
    """(layout, block mask) for Flex; the mask_mod rides on the block mask."""
    from haloattn.backends.flex import masks, mods

    layout = flex_layout(problem)
    tables = masks.axis_tables(problem, layout, device)
    mask_mod = mods.mask_mod(problem, layout, tables, None)
    return layout, masks.block_mask(problem, layout, mask_mod, device, allow_full=True)


def check_flex_mask(problem, layout, block_mask):
    """Check Flex's mask against the exact rule, every (query, key) pair in the layout's order: the
    mask_mod must equal geometry.attends (AND over axes), and each block must be listed as
    partial / full / absent exactly as its pairs are some-but-not-all / all / none. Returns the
    number of mismatching pairs plus mismatching blocks (0 when the mask is right)."""
    N, Bs = layout.positions, block_mask.BLOCK_SIZE[0]
    n = N // Bs
    device = block_mask.kv_indices.device

    def dense(num, indices):
        d = torch.zeros(n, n, dtype=torch.bool)
        for qb in range(n):
            d[qb, indices[0, 0, qb, :num[0, 0, qb]].long().cpu()] = True
        return d

    x = torch.arange(problem.tokens).reshape(1, *problem.spatial, 1, 1)
    bad = int((from_tiles(to_tiles(x, layout), layout) != x).sum())  # from_tiles undoes to_tiles
    partial = dense(block_mask.kv_num_blocks, block_mask.kv_indices)
    full = dense(block_mask.full_kv_num_blocks, block_mask.full_kv_indices)
    # The q-major copies (the backward pass walks these) must be the transposes.
    bad += int((dense(block_mask.q_num_blocks, block_mask.q_indices) != partial.T).sum())
    bad += int((dense(block_mask.full_q_num_blocks, block_mask.full_q_indices) != full.T).sum())
    coords = [c.to(device) for c in layout.coords]
    valid = layout.valid.to(device)  # padding positions: never keys, their query rows never written
    mask_mod = block_mask.mask_mod
    kv = torch.arange(N, device=device)
    zero = torch.zeros((), dtype=torch.long, device=device)
    blocks = max(1, (1 << 24) // (N * Bs))  # query blocks per slab
    for qb0 in range(0, n, blocks):
        q = torch.arange(qb0 * Bs, min(qb0 + blocks, n) * Bs, device=device)
        exact = None
        for axis, c in zip(problem.axes, coords):
            axis_ok = attends(axis, problem.pattern, c[q][:, None], c[None, :])
            exact = axis_ok if exact is None else exact & axis_ok
        exact = exact & valid[None, :]
        real = valid[q][:, None]
        bad += int(((mask_mod(zero, zero, q[:, None], kv[None, :]) != exact) & real).sum())
        per_block, real_rows = exact.reshape(-1, Bs, n, Bs), real.reshape(-1, Bs, 1, 1)
        some = (per_block & real_rows).any(3).any(1).cpu()
        every = (per_block | ~real_rows).all(3).all(1).cpu() & some
        rows = slice(qb0, qb0 + some.shape[0])
        bad += int((full[rows] != every).sum()) + int((partial[rows] != (some & ~every)).sum())
    return bad


def make_inputs(index, device="cuda", dtype=torch.bfloat16):
    """The problem's q, k, v (seeded by its index, so every process draws the same tensors)."""
    name, spatial, window, options, D = PROBLEMS[index]
    torch.manual_seed(index)
    q, k, v = (torch.randn(BATCH, *spatial, HEADS, D, device=device, dtype=dtype) for _ in range(3))
    return q, k, v, build_problem(q, k, v, window, **options)


def tune_candidates(index, launch, tiles):
    """Yield (config, forward thunk, backward thunk) for every tuning candidate of a problem."""
    q, k, v, problem = make_inputs(index)
    inputs = haloattn.backend.AttentionInputs(q, k, v)
    out, lse = launch.forward(problem, inputs)
    go = torch.randn_like(out)
    needs = (True, True, True, False, False, False, False)
    for cfg in tiles.candidate_configs(problem):
        yield (problem, cfg, lambda cfg=cfg: launch.forward(problem, inputs, cfg),
               lambda cfg=cfg: launch.backward(problem, inputs, out, lse, go, None, needs, cfg))


def tune_problem(index, launch, tiles):
    """Time every tuning candidate's forward and backward kernels; default over best."""
    fwd_ms, bwd_ms, problem = {}, {}, None
    for problem, cfg, fwd, bwd in tune_candidates(index, launch, tiles):
        f_key = json.dumps(cfg["fwd"], sort_keys=True)
        b_key = json.dumps({"dq": cfg["dq"], "dkdv": cfg["dkdv"]}, sort_keys=True)
        if f_key not in fwd_ms:
            fwd_ms[f_key] = bench(fwd)
        if b_key not in bwd_ms:
            bwd_ms[b_key] = bench(bwd)
    default = tiles.default_config(problem)
    f_default = fwd_ms[json.dumps(default["fwd"], sort_keys=True)]
    b_default = bwd_ms[json.dumps({"dq": default["dq"], "dkdv": default["dkdv"]}, sort_keys=True)]
    return {"problem": PROBLEMS[index][0], "tune_fwd_default_over_best": f_default / min(fwd_ms.values()),
            "tune_bwd_default_over_best": b_default / min(bwd_ms.values()), "tune_fwd_ms": fwd_ms, "tune_bwd_ms": bwd_ms}


# ---- --check-flex: Flex's mask against haloattn, without timing anything (runs on a CPU).

# Small problems with every option of PROBLEMS, for an end-to-end Flex run that a CPU can afford.
FLEX_SMOKE = [
    ((1024,), 255, {}),
    ((32, 32), 7, {}),
    ((32, 32), 7, {"dilation": 2}),
    ((32, 32), 7, {"causal": (True, False)}),
    ((32, 32), 8, {"stride": 4}),
    ((32, 32), 16, {"stride": 16}),
    ((4, 16, 16), (3, 5, 5), {"causal": (True, False, False)}),
]


def check_flex(indices, device, log=print):
    """Block mask and mask_mod of every problem in ``indices`` against the exact rule, at full
    size; then compiled Flex forward (and backward off CPU, where Flex has none) against
    haloattn's reference backend on FLEX_SMOKE. Returns the number of failures."""
    failures = 0
    for index in indices:
        name, spatial, window, options, _ = PROBLEMS[index]
        stub = torch.empty(1, *spatial, 1, 8)
        problem = build_problem(stub, stub, stub, window, **options)
        t0 = time.time()
        layout, block_mask = flex_setup(problem, device)
        built = time.time() - t0
        bad = check_flex_mask(problem, layout, block_mask)
        n = layout.blocks
        partial, full = int(block_mask.kv_num_blocks.sum()), int(block_mask.full_kv_num_blocks.sum())
        log(f"{name}: tile {layout.tile}, {n}x{n} blocks: {partial} partial, {full} full, {n * n - partial - full} "
            f"skipped; built in {built:.2f} s, checked in {time.time() - t0 - built:.1f} s: "
            f"{'OK' if bad == 0 else f'{bad} MISMATCHES'}")
        failures += bad > 0

    flex = flex_function()
    backward = torch.device(device).type != "cpu"
    for spatial, window, options in FLEX_SMOKE:
        torch.manual_seed(0)
        q, k, v = (torch.randn(1, *spatial, 2, 32, device=device, requires_grad=backward) for _ in range(3))
        problem = build_problem(q, k, v, window, **options)
        t0 = time.time()
        layout, block_mask = flex_setup(problem, device)
        f_out = from_tiles(flex(*(to_tiles(t, layout) for t in (q, k, v)), block_mask=block_mask), layout)
        ref = haloattn.attention(q, k, v, window, backend="reference", **options)
        errors = [((f_out - ref).norm() / ref.norm()).item()]
        if backward:
            go = torch.randn_like(ref)
            grads = [torch.autograd.grad(out, (q, k, v), go) for out in (f_out, ref)]
            errors += [((a - b).norm() / b.norm()).item() for a, b in zip(*grads)]
        ok = max(errors) < 1e-3  # float32: a wrong mask shows as errors of 1e-2 and more
        log(f"Flex end to end, {spatial} window {window} {options}: relative error "
            f"{' '.join(f'{e:.1e}' for e in errors)} ({'out, dq, dk, dv' if backward else 'out'}), "
            f"{time.time() - t0:.1f} s: {'OK' if ok else 'FAILED'}")
        failures += not ok
    return failures


# ---- Flex workers (child processes of this script) and their supervisor.

ROW_TAG = "FLEXROW "


def flex_function():
    from torch.nn.attention.flex_attention import flex_attention

    # One Flex compile per problem and process: keep dynamo from falling back to eager.
    for limit in ("cache_size_limit", "recompile_limit"):
        if hasattr(torch._dynamo.config, limit):
            setattr(torch._dynamo.config, limit, 64)
    return torch.compile(flex_attention, dynamic=False)


def flex_worker(phase, indices, tune):
    """phase "compile": run haloattn (default config, and every tune candidate of the problems in
    ``tune``) and Flex forward and forward+backward once; phase "time": time Flex and compare its
    output with haloattn's. One ROW_TAG line per problem on stdout."""
    flex = flex_function()
    from haloattn.backends.triton import launch, tiles

    for index in indices:
        began = time.time()
        name, spatial, window, options, D = PROBLEMS[index]
        q, k, v, problem = make_inputs(index)
        row = {"index": index}
        if phase == "compile":
            out = haloattn.attention(q, k, v, window, backend="triton", **options)
            qg, kg, vg = (t.clone().requires_grad_(True) for t in (q, k, v))
            haloattn.attention(qg, kg, vg, window, backend="triton", **options).backward(torch.randn_like(out))
            if index in tune:
                for _, _, fwd, bwd in tune_candidates(index, launch, tiles):
                    fwd()
                    bwd()
            torch.cuda.synchronize()
            row["triton_compile_s"] = time.time() - began
        t0 = time.time()
        layout, block_mask = flex_setup(problem, q.device)
        row["flex_block_mask_s"] = time.time() - t0
        fq, fk, fv = (to_tiles(t, layout) for t in (q, k, v))
        f_out = flex(fq, fk, fv, block_mask=block_mask)
        torch.cuda.synchronize()
        row["flex_fwd_ready_s"] = time.time() - t0
        fqg, fkg, fvg = (t.detach().clone().requires_grad_(True) for t in (fq, fk, fv))
        fgo = torch.randn_like(f_out)
        flex(fqg, fkg, fvg, block_mask=block_mask).backward(fgo)
        torch.cuda.synchronize()
        row["flex_fwdbwd_ready_s"] = time.time() - t0
        if phase == "time":
            out = haloattn.attention(q, k, v, window, backend="triton", **options)
            row["flex_token_tile"] = list(layout.tile)
            row["flex_vs_triton_rel_error"] = ((from_tiles(f_out, layout).float() - out.float()).norm()
                                               / out.float().norm()).item()
            row["flex_fwd_ms"] = bench(lambda: flex(fq, fk, fv, block_mask=block_mask))
            flex_fwd_bwd = forward_backward(lambda: flex(fqg, fkg, fvg, block_mask=block_mask), [fqg, fkg, fvg], fgo)
            row["flex_fwdbwd_ms"] = bench(flex_fwd_bwd)
            bench_graph(row, "flex_fwd_graph_ms", lambda: flex(fq, fk, fv, block_mask=block_mask))
            bench_graph(row, "flex_fwdbwd_graph_ms", flex_fwd_bwd)
        row["worker_s"] = time.time() - began
        print(ROW_TAG + json.dumps(row), flush=True)
        del block_mask, f_out, fq, fk, fv, fqg, fkg, fvg
        torch.cuda.empty_cache()


def _worker_command(phase, indices, tune):
    cmd = [sys.executable, os.path.abspath(__file__), "--flex-worker", phase, "--only", ",".join(map(str, indices))]
    if tune:
        cmd += ["--tune", ",".join(map(str, tune))]
    return cmd


def _start(cmd):
    env = dict(os.environ, TORCHINDUCTOR_COMPILE_THREADS="1", PYTHONUNBUFFERED="1")
    # Own process group: a stalled worker is killed with whatever it started.
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, env=env, start_new_session=True)


def _kill(proc):
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()


def _rows(proc, deadline_of):
    """Yield (row or None) from a worker's ROW_TAG lines; None once ``deadline_of()`` passes first.
    Reads the pipe unbuffered, so two lines arriving together are both seen."""
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    buffer = b""
    try:
        while True:
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                text = line.decode(errors="replace")
                if text.startswith(ROW_TAG):
                    yield json.loads(text[len(ROW_TAG):])
                else:
                    print(text, flush=True)
            # Whatever is already in the pipe counts, even past the deadline.
            if not sel.select(timeout=max(0.0, deadline_of() - time.time())):
                if time.time() >= deadline_of():
                    yield None
                    return
                continue
            chunk = os.read(proc.stdout.fileno(), 65536)
            if not chunk:
                return  # the worker exited
            buffer += chunk
    finally:
        sel.close()


def flex_compile_phase(indices, tune, timeout, log=print):
    """One compile worker per problem, all at once; returns {index: status row}."""
    began = time.time()
    procs = {index: _start(_worker_command("compile", [index], tune if index in tune else [])) for index in indices}
    status = {}
    for index, proc in procs.items():
        for row in _rows(proc, lambda: began + timeout):
            if row is None:
                status[index] = {"flex_status": f"timeout (compile > {timeout:.0f} s)"}
            else:
                row["flex_status"] = "compiled"
                status[index] = row
            break
        _kill(proc)
        status.setdefault(index, {"flex_status": f"error (compile worker exit code {proc.returncode})"})
        log(f"[{time.time() - began:6.1f}s] flex compile {PROBLEMS[index][0]}: {status[index]}")
    return status


def flex_time_phase(indices, timeout, log=print):
    """Time Flex on ``indices`` in one worker; a problem that takes over ``timeout`` seconds (or
    kills its worker) is reported as such and a fresh worker takes the rest."""
    results = {}
    pending = list(indices)
    while pending:
        proc = _start(_worker_command("time", pending, []))
        deadline = [time.time() + timeout + 15]  # the first problem also pays the worker's start
        stalled = False
        for row in _rows(proc, lambda: deadline[0]):
            if row is None:
                results[pending.pop(0)] = {"flex_status": f"timeout (> {timeout:.0f} s)"}
                stalled = True
                break
            index = row.pop("index")
            row["flex_status"] = "timed"
            results[index] = row
            if index in pending:
                pending.remove(index)
            log(f"flex timed {PROBLEMS[index][0]}: {row}")
            deadline[0] = time.time() + timeout
            if not pending:
                break
        _kill(proc)
        if pending and not stalled:  # the worker died on its current problem
            results[pending.pop(0)] = {"flex_status": f"error (timing worker exit code {proc.returncode})"}
    return results


# ---- The timing run.

def time_triton_and_dense(index, dense_cache, phase):
    name, spatial, window, options, D = PROBLEMS[index]
    q, k, v, problem = make_inputs(index)
    device, dtype = q.device, q.dtype
    N = problem.tokens
    pairs = attended_pairs(problem)
    fwd_flops = 4 * BATCH * HEADS * D * pairs
    row = {"problem": name, "tokens": N, "pairs_per_query": pairs / N, "head_dim": D, "fwd_flops": fwd_flops}

    # dense cuDNN over the same tokens (cached per N, D)
    if (N, D) not in dense_cache:
        dq, dk, dv = (torch.randn(BATCH, HEADS, N, D, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
        dgo = torch.randn(BATCH, HEADS, N, D, device=device, dtype=dtype)
        dense_flops = 4 * BATCH * HEADS * D * N * N
        dense = {"dense_flops": dense_flops}
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            dense["dense_fwd_ms"] = bench(lambda: F.scaled_dot_product_attention(dq, dk, dv))
            dense_fwd_bwd = forward_backward(lambda: F.scaled_dot_product_attention(dq, dk, dv), [dq, dk, dv], dgo)
            dense["dense_fwdbwd_ms"] = bench(dense_fwd_bwd)
            bench_graph(dense, "dense_fwd_graph_ms", lambda: F.scaled_dot_product_attention(dq, dk, dv))
            bench_graph(dense, "dense_fwdbwd_graph_ms", dense_fwd_bwd)
        dense_cache[(N, D)] = dense
        del dq, dk, dv, dgo
    dense = dense_cache[(N, D)]
    row.update(dense)
    for timing in ("", "_graph"):
        for step, factor in (("fwd", 1.0), ("fwdbwd", 3.5)):
            row[f"dense_{step}{timing}_tflops"] = tflops(dense, f"dense_{step}{timing}_ms", factor * dense["dense_flops"])
    phase("dense cuDNN done")

    time_dense_windows(problem, row)
    out = haloattn.attention(q, k, v, window, backend="triton", **options)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out2 = haloattn.attention(q, k, v, window, backend="triton", **options)
    torch.cuda.synchronize()
    lse_bytes = out2.numel() // D * 4
    row["fwd_extra_bytes"] = torch.cuda.max_memory_allocated() - base - out2.numel() * out2.element_size() - lse_bytes
    del out2
    qg, kg, vg = (t.clone().requires_grad_(True) for t in (q, k, v))
    go = torch.randn_like(out)

    def fwd():
        return haloattn.attention(q, k, v, window, backend="triton", **options)

    fwd_bwd = forward_backward(lambda: haloattn.attention(qg, kg, vg, window, backend="triton", **options),
                               [qg, kg, vg], go)

    row["triton_fwd_ms"] = bench(fwd)
    row["triton_fwdbwd_ms"] = bench(fwd_bwd)
    bench_graph(row, "triton_fwd_graph_ms", fwd)
    bench_graph(row, "triton_fwdbwd_graph_ms", fwd_bwd)
    add_rates(row, "triton")
    phase("triton done")
    return row


def blocked_windows(problem):
    """(windows, tokens per window) where every query attends exactly its own aligned block (stride
    == window dividing the axis, undilated, not causal, pattern "neighborhood" on every axis), else
    None. Such a problem is a batch of independent dense attentions."""
    if problem.pattern != "neighborhood":
        return None
    if any(a.stride != a.window or a.length % a.window or a.dilation != 1 or a.causal for a in problem.axes):
        return None
    windows = 1
    for a in problem.axes:
        windows *= a.length // a.window
    return windows, problem.tokens // windows


def time_dense_windows(problem, row):
    """On a blocked problem, the dense kernels on the same work: each window's tokens gathered into
    a contiguous sequence (the gather is not timed) and attended by SDPA's cuDNN and Flash kernels
    as a batch of short sequences. It shows how fast the best dense kernels run these short
    sequences, a yardstick beside the long-sequence cuDNN rate that the efficiency divides by."""
    blocked = blocked_windows(problem)
    if blocked is None:
        return
    windows, tokens = blocked
    shape = (BATCH * windows, HEADS, tokens, problem.head_dim)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    go = torch.randn_like(q)
    row["windows_dense_shape"] = list(shape)
    for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
        with sdpa_kernel(backend):
            bench_graph(row, f"windows_{name}_fwd_graph_ms", lambda: F.scaled_dot_product_attention(q, k, v))
            bench_graph(row, f"windows_{name}_fwdbwd_graph_ms",
                        forward_backward(lambda: F.scaled_dot_product_attention(q, k, v), [q, k, v], go))
        for step, factor in (("fwd", 1.0), ("fwdbwd", 3.5)):
            rate = tflops(row, f"windows_{name}_{step}_graph_ms", factor * row["fwd_flops"])
            if rate is not None:
                row[f"windows_{name}_{step}_graph_tflops"] = rate
                row[f"windows_{name}_{step}_graph_efficiency"] = rate / row[f"dense_{step}_graph_tflops"]


def windows_table(rows):
    """Blocked problems: triton beside the dense kernels on the windows as a batch (CUDA graph)."""
    lines = ["| problem | windows as a batch | step | triton TFLOP/s | cuDNN TFLOP/s | Flash TFLOP/s "
             "| long-sequence cuDNN TFLOP/s | triton / best of them |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "windows_dense_shape" not in r:
            continue
        for step in ("fwd", "fwdbwd"):
            rates = [r.get(f"windows_{n}_{step}_graph_tflops") for n in ("cudnn", "flash")]
            ours = r.get(f"triton_{step}_graph_tflops")
            best = max((x for x in rates if x is not None), default=None)
            cells = [format(x, ".0f") if x is not None else "-" for x in (ours, *rates, r.get(f"dense_{step}_graph_tflops"))]
            ratio = format(ours / best, ".2f") if ours and best else "-"
            lines.append(f"| {r['problem']} | {'x'.join(map(str, r['windows_dense_shape']))} | {step} | "
                         + " | ".join(cells) + f" | {ratio} |")
    return "\n".join(lines) if len(lines) > 2 else ""


def tflops(row, key, flops):
    return flops / row[key] / 1e9 if key in row else None


def add_rates(row, method):
    """Effective TFLOP/s, efficiency against dense cuDNN and (for Flex) haloattn's speed-up, per
    timing (do_bench, CUDA graph) and pass (forward, forward+backward) that was measured."""
    for timing in ("", "_graph"):
        for step, flops in (("fwd", row["fwd_flops"]), ("fwdbwd", 3.5 * row["fwd_flops"])):
            rate = tflops(row, f"{method}_{step}{timing}_ms", flops)
            dense = row.get(f"dense_{step}{timing}_tflops")
            if rate is None:
                continue
            row[f"{method}_{step}{timing}_tflops"] = rate
            if dense is not None and method == "triton":
                row[f"{step}{timing}_efficiency"] = rate / dense
            ours = row.get(f"triton_{step}{timing}_ms")
            if method == "flex" and ours is not None:
                row[f"speedup_{step}{timing}_vs_flex"] = row[f"flex_{step}{timing}_ms"] / ours


def add_flex(row, flex):
    row.update(flex)
    add_rates(row, "flex")


def markdown_table(rows):
    """Two lines per problem: do_bench timing (host included) and CUDA-graph replays (device)."""
    header = ("| problem | timing | pairs/query | triton fwd TFLOP/s | eff fwd | triton fwd+bwd TFLOP/s | eff fwd+bwd "
              "| cuDNN dense fwd / fwd+bwd TFLOP/s | Flex fwd TFLOP/s | x Flex fwd | Flex fwd+bwd TFLOP/s "
              "| x Flex fwd+bwd | fwd extra memory |")
    lines = [header, "|" + "---|" * (header.count("|") - 1)]

    def fmt(r, key, spec=".0f"):
        if r.get(key) is not None:
            return format(r[key], spec)
        if "flex" not in key:
            return "-"  # a capture that failed: the JSON and the log say why
        status = r.get("flex_status", "not run")
        return "-" if status in ("timed", "compiled") else status

    for r in rows:
        for timing, label in (("", "do_bench"), ("_graph", "CUDA graph")):
            def cell(key, spec=".0f"):
                step, _, rest = key.partition("|")
                return fmt(r, step + timing + rest, spec)

            lines.append(
                f"| {r['problem']} | {label} | {r['pairs_per_query']:.0f} | {cell('triton_fwd|_tflops')} "
                f"| {cell('fwd|_efficiency', '.2f')} | {cell('triton_fwdbwd|_tflops')} | {cell('fwdbwd|_efficiency', '.2f')} "
                f"| {cell('dense_fwd|_tflops')} / {cell('dense_fwdbwd|_tflops')} | {cell('flex_fwd|_tflops')} "
                f"| {cell('speedup_fwd|_vs_flex', '.1f')} | {cell('flex_fwdbwd|_tflops')} "
                f"| {cell('speedup_fwdbwd|_vs_flex', '.1f')} | {r['fwd_extra_bytes'] / 2**20:.1f} MiB |"
            )
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tune", default="", help="comma list of problem indices whose tuning candidates are timed")
    parser.add_argument("--no-flex", action="store_true")
    parser.add_argument("--flex-compile-timeout", type=float, default=200.0,
                        help="seconds for the parallel compile phase (all problems together)")
    parser.add_argument("--flex-timeout", type=float, default=60.0, help="seconds per problem for timing Flex")
    parser.add_argument("--flex-compile-only", metavar="FILE", help="run the compile phase alone, outcome to FILE")
    parser.add_argument("--flex-compile-status", metavar="FILE", help="outcome of an earlier --flex-compile-only")
    parser.add_argument("--check-flex", metavar="DEVICE", nargs="?", const="cpu",
                        help="check Flex's block mask and mask_mod against haloattn on DEVICE (default cpu), "
                             "time nothing, exit 1 on a mismatch")
    parser.add_argument("--flex-worker", choices=("compile", "time"), help=argparse.SUPPRESS)
    parser.add_argument("--only", default="", help="comma list of problem indices")
    parser.add_argument("--json")
    parser.add_argument("--markdown")
    args = parser.parse_args()
    only = [int(i) for i in args.only.split(",") if i] or list(range(len(PROBLEMS)))
    tune = [int(i) for i in args.tune.split(",") if i]
    began = time.time()

    def log(message):  # progress on stderr: which step a time limit stopped, and how long each took
        print(f"[{time.time() - began:6.1f}s] {message}", file=sys.stderr, flush=True)

    if args.check_flex:
        sys.exit(1 if check_flex(only, args.check_flex, log) else 0)
    if args.flex_worker:
        flex_worker(args.flex_worker, only, tune)
        return
    if args.flex_compile_only:
        status = flex_compile_phase(only, tune, args.flex_compile_timeout, log)
        with open(args.flex_compile_only, "w") as f:
            json.dump({str(k): v for k, v in status.items()}, f, indent=1)
        return

    compiled = {}
    if not args.no_flex:
        if args.flex_compile_status and os.path.exists(args.flex_compile_status):
            with open(args.flex_compile_status) as f:
                compiled = {int(k): v for k, v in json.load(f).items()}
        missing = [i for i in only if i not in compiled]
        if missing:
            compiled.update(flex_compile_phase(missing, tune, args.flex_compile_timeout, log))

    from haloattn.backends.triton import launch, tiles

    dense_cache = {}
    rows = []
    for index in only:
        rows.append(time_triton_and_dense(index, dense_cache, lambda what: log(f"{PROBLEMS[index][0]}: {what}")))
        print(json.dumps(rows[-1]), flush=True)
        torch.cuda.empty_cache()

    if not args.no_flex:
        ready = [i for i in only if compiled.get(i, {}).get("flex_status") == "compiled"]
        timed = flex_time_phase(ready, args.flex_timeout, log)
        for index, row in zip(only, rows):
            add_flex(row, dict(compiled.get(index, {}), **timed.get(index, {})))

    table = markdown_table(rows)
    blocked = windows_table(rows)
    if blocked:
        table += "\n\nThe blocked problems beside dense attention over their windows as a batch (CUDA graph):\n\n" + blocked
    print(table)
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "triton": __import__("triton").__version__, "seconds": time.time() - began}
    print(json.dumps(meta))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(table + "\n")
    # Tuning last: the table above is already saved if the run's time limit stops this part.
    tuned = []
    for index in tune:
        tuned.append(tune_problem(index, launch, tiles))
        print(json.dumps(tuned[-1]), flush=True)
        if args.json:
            with open(args.json.replace(".json", "_tune.json"), "w") as f:
                json.dump(tuned, f, indent=1)


if __name__ == "__main__":
    main()
