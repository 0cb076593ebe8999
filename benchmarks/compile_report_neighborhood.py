"""Compile the triton neighbourhood kernels for sm_90 without a GPU and report what the compiler made.

No device time: the launch code of ``haloattn.backends.triton.launch`` runs on meta tensors with its
kernel launch captured, the captured arguments are specialised the way Triton's JIT would
(16-divisible ints and pointers get the divisibility hint, ints equal to 1 become constants), and
``triton.compile`` builds for ``cuda:90`` with the bundled ptxas. Printed per kernel: registers,
spills (local-memory bytes), shared memory, and counts of the SASS instructions that matter here
(HGMMA = wgmma, LDGSTS = cp.async, UTMALDG = TMA, LDG = plain global loads, MUFU.EX2).

    python benchmarks/compile_report_neighborhood.py [--only 1,5] [--backward] [--sass DIR]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile

import torch
import triton
from triton.backends.compiler import GPUTarget

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_neighborhood import BATCH, HEADS, PROBLEMS  # noqa: E402

from haloattn.backend import AttentionInputs  # noqa: E402
from haloattn.backends.triton import launch, tiles  # noqa: E402
from haloattn.problem import build_problem  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)
DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.int64: "i64", torch.int32: "i32"}
COUNTED = ("HGMMA", "HMMA", "LDGSTS", "UTMALDG", "LDG", "STG", "LDS", "STS", "LDSM", "MUFU.EX2", "BAR.SYNC", "LDL", "STL")


class Captured(Exception):
    pass


class Capture:
    """Stands in for a JITFunction: ``fn[grid](*args, **kwargs)`` records instead of launching."""

    def __init__(self, fn, sink):
        self.fn, self.sink = fn, sink

    def __getitem__(self, grid):
        def record(*args, **kwargs):
            self.sink.append((self.fn, args, kwargs))
        return record


def specialise(fn, args, kwargs):
    """(signature, constexprs, attrs, options) the JIT would compile for these arguments."""
    names = fn.arg_names
    signature, constexprs, attrs = {}, {}, {}
    values = dict(zip(names, args))
    values.update({k: v for k, v in kwargs.items() if k in names})
    for index, name in enumerate(names):
        value = values[name]
        if fn.params[index].is_constexpr:
            signature[name], constexprs[name] = "constexpr", value
        elif isinstance(value, torch.Tensor):
            signature[name] = "*" + DTYPES[value.dtype]
            attrs[(index,)] = [["tt.divisibility", 16]]
        elif isinstance(value, bool):
            signature[name] = "i1"
        elif isinstance(value, int):
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


def sass_counts(cubin: bytes, keep_dir=None, label="kernel"):
    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([cuobjdump, "-sass", f.name], capture_output=True, text=True).stdout
    if keep_dir:
        os.makedirs(keep_dir, exist_ok=True)
        with open(os.path.join(keep_dir, label + ".sass"), "w") as out:
            out.write(sass)
    ops = re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)", sass)
    counts = {}
    for key in COUNTED:
        counts[key] = sum(1 for op in ops if op == key or op.startswith(key + "."))
    return counts


def compile_report(fn, args, kwargs, label, keep_dir=None):
    signature, constexprs, attrs, options = specialise(fn, args, kwargs)
    src = triton.compiler.ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    kernel = triton.compile(src, target=TARGET, options=options)
    md = kernel.metadata
    n_regs = n_spills = None
    try:
        kernel._init_handles()
    except Exception:
        pass  # no driver: registers come from ptxas' report below
    info = subprocess.run(
        [os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas"), "-v",
         "--gpu-name", "sm_90a" if "sm_90a" in kernel.asm["ptx"] else "sm_90", "-o", os.devnull, "-"],
        input=kernel.asm["ptx"], capture_output=True, text=True).stderr
    m = re.search(r"Used (\d+) registers", info)
    n_regs = int(m.group(1)) if m else None
    m = re.search(r"(\d+) bytes spill stores", info)
    n_spills = int(m.group(1)) if m else None
    counts = sass_counts(kernel.asm["cubin"], keep_dir, label)
    ops = " ".join(f"{k}={v}" for k, v in counts.items() if v)
    print(f"{label}: warps {options.get('num_warps')} stages {options.get('num_stages')} regs {n_regs} "
          f"spill-stores {n_spills}B shared {md.shared}B | {ops}", flush=True)


def problem_tensors(index, device="meta"):
    name, spatial, window, options, D = PROBLEMS[index]
    q, k, v = (torch.empty(BATCH, *spatial, HEADS, D, device=device, dtype=torch.bfloat16) for _ in range(3))
    return name, q, k, v, build_problem(q, k, v, window, **options)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="1")
    parser.add_argument("--backward", action="store_true")
    parser.add_argument("--sass", help="folder to keep the SASS of each kernel in")
    parser.add_argument("--config", help="JSON config (as tiles.normalise takes) instead of the default")
    args = parser.parse_args()
    import json

    os.environ.pop("TRITON_INTERPRET", None)
    for index in [int(i) for i in args.only.split(",")]:
        name, q, k, v, problem = problem_tensors(index)
        config = json.loads(args.config) if args.config else None
        print(f"# {name}: {tiles.normalise(config, problem)}")
        sink = []
        original, copy_engine = launch._kernel, launch.has_copy_engine
        launch._kernel = lambda fn: Capture(fn, sink)
        launch.has_copy_engine = lambda device: True  # compiling for sm_90: descriptor loads are there
        try:
            inputs = AttentionInputs(q, k, v)
            out, lse = launch.forward(problem, inputs, config)
            if args.backward:
                needs = (True, True, True, False, False, False, False)
                launch.backward(problem, inputs, out, lse, torch.empty_like(out), None, needs, config)
        finally:
            launch._kernel, launch.has_copy_engine = original, copy_engine
        for fn, a, kw in sink:
            compile_report(fn, a, kw, f"{index}-{fn.__name__}", args.sass)


if __name__ == "__main__":
    main()
