"""Compile the triton_window kernels for sm_90 without a GPU and report what the compiler made.

No device time: ``window_launch.forward``/``backward`` run on meta tensors with the kernel launch
captured; the captured arguments are specialised the way Triton's JIT would (pointers and
16-divisible ints get the divisibility hint, ints equal to 1 become constants unless the kernel
excludes them from specialisation) and ``triton.compile`` builds for ``cuda:90`` with the bundled
ptxas. Printed per kernel: registers, spills, shared memory, and counts of the SASS instructions that
matter (HGMMA = wgmma, HMMA = mma.sync, LDGSTS = cp.async, UTMALDG = TMA, LDG = plain global loads).

Shapes are bench_window.SHAPES (q/k/v strided views of a [B, *grid, 3, heads, D] projection, with
Swin's rpb); ``--config`` takes a window_launch config dict (``forward_num_stages``, ...).

    python benchmarks/compile_report_window.py [--dtypes float16,float32] [--shapes 0,1,2]
        [--backward] [--config '{"forward_num_stages": 3}'] [--sass DIR] [--ttgir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

os.environ.pop("TRITON_INTERPRET", None)

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402

import haloattn.nn  # noqa: E402
from haloattn.backend import AttentionInputs  # noqa: E402
from haloattn.backends.triton import window_launch  # noqa: E402
from haloattn.problem import build_problem  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)
DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.int64: "i64", torch.int32: "i32",
          torch.int8: "i8"}
COUNTED = ("HGMMA", "HMMA", "LDGSTS", "UTMALDG", "LDG", "STG", "LDS", "STS", "LDSM", "MUFU.EX2", "BAR.SYNC",
           "LDL", "STL")
# name: (batch, grid, window, heads, head_dim), as benchmarks/bench_window.py SHAPES
SHAPES = [
    ("Swin-T stage 1", (128, (56, 56), 7, 3, 32)),
    ("Swin-B 384 stage 1", (32, (96, 96), 12, 4, 32)),
    ("SwinIR 8x8, head_dim 30", (16, (64, 64), 8, 6, 30)),
]


class Capture:
    def __init__(self, fn, sink):
        self.fn, self.sink = fn, sink

    def __getitem__(self, grid):
        def record(*args, **kwargs):
            self.sink.append((self.fn, grid, args, kwargs))
        return record


def specialise(fn, args, kwargs):
    names = fn.arg_names
    signature, constexprs, attrs = {}, {}, {}
    values = dict(zip(names, args))
    values.update({k: v for k, v in kwargs.items() if k in names})
    for index, name in enumerate(names):
        value = values[name]
        param = fn.params[index]
        if param.is_constexpr:
            signature[name], constexprs[name] = "constexpr", value
        elif isinstance(value, torch.Tensor):
            signature[name] = "*" + DTYPES[value.dtype]
            attrs[(index,)] = [["tt.divisibility", 16]]
        elif isinstance(value, bool):
            signature[name] = "i1"
        elif isinstance(value, int):
            if param.do_not_specialize:  # no 1-constant, no divisibility hint
                signature[name] = "i64" if abs(value) >= 2**31 else "i32"
                continue
            if value == 1:
                signature[name], constexprs[name] = "constexpr", 1
                continue
            signature[name] = "i64" if abs(value) >= 2**31 else "i32"
            if value % 16 == 0:
                attrs[(index,)] = [["tt.divisibility", 16]]
        elif isinstance(value, float):
            signature[name] = "fp32"
        else:
            raise TypeError(f"argument {name}: {type(value)}")
    options = {k: v for k, v in kwargs.items() if k not in names}
    return signature, constexprs, attrs, options


def tool(name):
    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)


def sass_of(cubin):
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([tool("cuobjdump"), "-sass", f.name], capture_output=True, text=True).stdout


def count_ops(sass):
    ops = re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)", sass)
    return {key: sum(1 for op in ops if op == key or op.startswith(key + ".")) for key in COUNTED}


def compile_one(fn, args, kwargs, label, sass_dir=None, ttgir_dir=None):
    signature, constexprs, attrs, options = specialise(fn, args, kwargs)
    src = triton.compiler.ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    kernel = triton.compile(src, target=TARGET, options=options)
    ptx = kernel.asm["ptx"]
    info = subprocess.run([tool("ptxas"), "-v", "--gpu-name", "sm_90a" if "sm_90a" in ptx else "sm_90",
                           "-o", os.devnull, "-"], input=ptx, capture_output=True, text=True).stderr
    m = re.search(r"Used (\d+) registers", info)
    regs = int(m.group(1)) if m else None
    m = re.search(r"(\d+) bytes spill stores", info)
    spills = int(m.group(1)) if m else None
    sass = sass_of(kernel.asm["cubin"])
    counts = count_ops(sass)
    for folder, text, ext in ((sass_dir, sass, "sass"), (ttgir_dir, kernel.asm["ttgir"], "ttgir"),
                              (ttgir_dir, ptx, "ptx")):
        if folder:
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, f"{label}.{ext}"), "w") as out:
                out.write(text)
    row = dict(label=label, warps=options.get("num_warps"), stages=kwargs.get("NUM_STAGES"), regs=regs,
               spills=spills, shared=kernel.metadata.shared, cp_async=ptx.count("cp.async.cg") + ptx.count("cp.async.ca"),
               **counts)
    ops = " ".join(f"{k}={v}" for k, v in counts.items() if v)
    print(f"{label}: warps {row['warps']} stages {row['stages']} regs {regs} spill-stores {spills}B "
          f"shared {row['shared']}B ptx-cp.async {row['cp_async']} | {ops}", flush=True)
    return row


def shape_inputs(batch, grid, window, heads, head_dim, dtype):
    q, k, v = torch.empty(batch, *grid, 3, heads, head_dim, device="meta", dtype=dtype).unbind(-3)
    table = torch.empty((2 * window - 1) ** 2, heads, device="meta")
    rpb = haloattn.nn.swin_table_to_rpb(table, (window, window)).contiguous()
    problem = build_problem(q, k, v, window, pattern="window", shift=0, scale=head_dim ** -0.5, rpb=rpb)
    return problem, AttentionInputs(q, k, v, rpb)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="0,1,2")
    parser.add_argument("--dtypes", default="float16,float32")
    parser.add_argument("--backward", action="store_true")
    parser.add_argument("--config", help="JSON window_launch config")
    parser.add_argument("--sass")
    parser.add_argument("--ttgir")
    args = parser.parse_args()
    config = json.loads(args.config) if args.config else None
    rows = []
    for index in [int(i) for i in args.shapes.split(",")]:
        name, (batch, grid, window, heads, head_dim) = SHAPES[index]
        for dtype_name in args.dtypes.split(","):
            dtype = getattr(torch, dtype_name)
            problem, inputs = shape_inputs(batch, grid, window, heads, head_dim, dtype)
            sink = []
            original = window_launch._kernel
            window_launch._kernel = lambda fn: Capture(fn, sink)
            try:
                out, lse = window_launch.forward(problem, inputs, config)
                if args.backward:
                    needs = (True, True, True, True, False, False, False)
                    window_launch.backward(problem, inputs, out, lse, torch.empty_like(out), None, needs, config)
            finally:
                window_launch._kernel = original
            for fn, grid_, a, kw in sink:
                label = f"{index}-{dtype_name}-{fn.__name__.replace('window_', '').replace('_kernel', '')}"
                print(f"# {name} {dtype_name}: grid {grid_}", flush=True)
                rows.append(compile_one(fn, a, kw, label, args.sass, args.ttgir))
    return rows


if __name__ == "__main__":
    main()
