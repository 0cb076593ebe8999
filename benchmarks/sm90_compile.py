"""Compile Triton kernels for sm_90 (H100/H200) on a machine without a GPU, and read what the
compiler made: the shared part of compile_report_neighborhood.py and compile_report_window.py.

Kernel launches are routed to :class:`Capture`, which records each launch instead of
running it; :func:`compile_captured` specialises the recorded arguments the way Triton's JIT would
(pointers and 16-divisible ints get the divisibility hint, ints equal to 1 become constants unless
the kernel excludes them from specialisation), builds for ``cuda:90`` with Triton's bundled ptxas,
and reports registers, spills, shared memory and counts of the SASS instructions that matter
(HGMMA = wgmma, HMMA = mma.sync, LDGSTS = cp.async, UTMALDG = TMA, LDG = plain global loads).
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import tempfile

import torch
import triton
from triton.backends.compiler import GPUTarget

TARGET = GPUTarget("cuda", 90, 32)
DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.int64: "i64",
          torch.int32: "i32", torch.int8: "i8"}
COUNTED = ("HGMMA", "HMMA", "LDGSTS", "UTMALDG", "LDG", "STG", "LDS", "STS", "LDSM", "MUFU.EX2", "BAR.SYNC",
           "LDL", "STL")


class Capture:
    """Stands in for a JITFunction: ``fn[grid](*args, **kwargs)`` appends (fn, grid, args, kwargs)."""

    def __init__(self, fn, sink):
        self.fn, self.sink = fn, sink

    def __getitem__(self, grid):
        def record(*args, **kwargs):
            self.sink.append((self.fn, grid, args, kwargs))
        return record


@contextlib.contextmanager
def captured_launches(launcher):
    """Within the block, kernel launches (``fast_launch.resolve``) record themselves instead of
    running; yields the list they are appended to. Launch plans are forgotten on the way in and
    out, so that none built while recording outlives the block. A launcher that checks for the
    copy engine (TMA) is told sm_90 has it."""
    from haloattn.backends.triton import fast_launch

    sink = []
    saved = {name: getattr(launcher, name) for name in ("has_copy_engine",) if hasattr(launcher, name)}
    saved_resolve = fast_launch.resolve
    fast_launch.clear_plans()
    fast_launch.resolve = lambda fn: Capture(fn, sink)
    if "has_copy_engine" in saved:
        launcher.has_copy_engine = lambda device: True
    try:
        yield sink
    finally:
        fast_launch.resolve = saved_resolve
        fast_launch.clear_plans()
        for name, value in saved.items():
            setattr(launcher, name, value)


def specialise(fn, args, kwargs):
    """(signature, constexprs, attrs, options) the JIT would compile for these arguments."""
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


def sass_of(cubin: bytes) -> str:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([tool("cuobjdump"), "-sass", f.name], capture_output=True, text=True).stdout


def count_ops(sass: str) -> dict:
    ops = re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)", sass)
    return {key: sum(1 for op in ops if op == key or op.startswith(key + ".")) for key in COUNTED}


def compile_captured(fn, args, kwargs, label, sass_dir=None, ttgir_dir=None) -> dict:
    """Build one captured launch for sm_90 and print (and return) what the compiler made."""
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
    # ptxas C7515: every wgmma of the kernel waits for the one before (no tensor-core pipelining).
    serialized = "C7515" in info
    sass = sass_of(kernel.asm["cubin"])
    counts = count_ops(sass)
    for folder, text, ext in ((sass_dir, sass, "sass"), (ttgir_dir, kernel.asm["ttgir"], "ttgir"),
                              (ttgir_dir, ptx, "ptx")):
        if folder:
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, f"{label}.{ext}"), "w") as out:
                out.write(text)
    row = dict(label=label, warps=options.get("num_warps"), stages=options.get("num_stages", kwargs.get("NUM_STAGES")),
               regs=regs, spills=spills, shared=kernel.metadata.shared,
               cp_async=ptx.count("cp.async.cg") + ptx.count("cp.async.ca"), **counts)
    ops = " ".join(f"{k}={v}" for k, v in counts.items() if v)
    row["wgmma_serialized"] = serialized
    print(f"{label}: warps {row['warps']} stages {row['stages']} regs {regs} spill-stores {spills}B "
          f"shared {row['shared']}B ptx-cp.async {row['cp_async']}{' WGMMA-SERIALIZED' if serialized else ''} | {ops}",
          flush=True)
    return row
