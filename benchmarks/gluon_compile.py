"""Build a Gluon kernel launch for sm_90 on any machine (no GPU), as the probes' --compile-only
does: what its registers, spills, shared memory and instruction mix come to."""

from __future__ import annotations

import json
import re

import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from triton.runtime.jit import mangle_type

from sm90_compile import count_ops, ptxas_report, sass_of

LAUNCH_OPTIONS = ("num_warps", "maxnreg")


def compiled_sm90(kernel, args, meta):
    """``kernel[grid](*args, **meta)`` compiled for sm_90 (Triton's compiled kernel: its asm holds
    the PTX and the cubin)."""
    signature, constexprs = {}, {}
    for name, value in zip(kernel.arg_names, args):
        signature[name] = ("fp32" if isinstance(value, float) else "i32" if isinstance(value, int)
                           else mangle_type(value))
    for name in kernel.arg_names[len(args):]:
        signature[name], constexprs[name] = "constexpr", meta[name]
    options = {key: meta[key] for key in LAUNCH_OPTIONS if key in meta}
    return triton.compile(GluonASTSource(kernel, signature, constexprs), target=GPUTarget("cuda", 90, 32),
                          options=options)


def build_sm90(kernel, args, meta) -> dict:
    """Compile ``kernel[grid](*args, **meta)`` for sm_90: shared bytes, registers a thread (the
    launch's; setmaxnreg moves them between partitions), spilled bytes and counted SASS ops."""
    compiled = compiled_sm90(kernel, args, meta)
    info = ptxas_report(compiled.asm["ptx"], 90)
    regs = re.search(r"Used (\d+) registers", info)
    spills = re.search(r"(\d+) bytes spill stores", info)
    counts = {key: n for key, n in count_ops(sass_of(compiled.asm["cubin"])).items() if n}
    return dict(shared=compiled.metadata.shared, regs=int(regs.group(1)) if regs else None,
                spill_bytes=int(spills.group(1)) if spills else 0, ops=counts)


def report(label: str, row: dict) -> None:
    """One line for people, one for tests (``RESULT {json}``)."""
    print(f"{label}: shared {row['shared']} B, {row['regs']} registers, {row['spill_bytes']} B spilled; {row['ops']}",
          flush=True)
    print("RESULT " + json.dumps(dict(row, label=label)), flush=True)
