"""Compile Triton kernels for a GPU target (sm_90 by default: H100/H200; also sm_80, sm_86, sm_89,
sm_100, sm_120) on a machine without a GPU, and read what the compiler made: the shared part of
compile_report_neighborhood.py, compile_report_window.py and the compile tests. (The module keeps
its first name, sm90_compile, because those import it.)

Kernel launches are routed to :class:`Capture`, which records each launch instead of running it;
within :func:`captured_launches` the launchers see the device limits of the chosen :class:`GPU`
(shared memory, copy engine, SMs), so they pick the configs they would pick on it.
:func:`compile_captured` specialises the recorded arguments the way Triton's JIT would (pointers
and 16-divisible ints get the divisibility hint, ints equal to 1 become constants unless the kernel
excludes them from specialisation), builds for the target with the ptxas that Triton bundles (and
would use for it), and reports registers, spills, shared memory and counts of the SASS
instructions that matter (HGMMA = wgmma, HMMA = mma.sync, UTCHMMA = tcgen05, LDGSTS = cp.async,
UTMALDG = TMA, LDG = plain global loads).
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import get_ptxas
from triton.runtime.jit import mangle_type

from haloattn.backends.triton.host_descriptors import is_host_descriptor

from ptx_register_operands import loop_invariant_register_operands  # beside this file, as its importers find it

KIB = 1024


@dataclass(frozen=True)
class GPU:
    """A compile target and what its device tells the launchers (device_limits)."""

    capability: int  # 90 for sm_90
    name: str
    shared_limit: int  # shared memory one block may opt in to, bytes
    multiprocessors: int

    @property
    def copy_engine(self) -> bool:
        """TMA tensor copies: sm_90 and newer (sm_100 and sm_120 too)."""
        return self.capability >= 90

    @property
    def target(self) -> GPUTarget:
        return GPUTarget("cuda", self.capability, 32)


# One GPU per target, with the CUDA programming guide's per-block shared memory (opt-in).
GPUS = {gpu.capability: gpu for gpu in (
    GPU(80, "A100", 163 * KIB, 108),
    GPU(86, "RTX 3090", 99 * KIB, 82),
    GPU(89, "RTX 4090", 99 * KIB, 128),
    GPU(90, "H100", 227 * KIB, 132),
    GPU(100, "B200", 227 * KIB, 148),
    GPU(120, "RTX 5090", 99 * KIB, 170),
)}
HOPPER = GPUS[90]
TARGET = HOPPER.target
DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.int64: "i64",
          torch.int32: "i32", torch.int8: "i8"}
COUNTED = ("HGMMA", "HMMA", "UTCHMMA", "LDGSTS", "UTMALDG", "LDG", "STG", "LDS", "STS", "LDSM", "MUFU.EX2",
           "BAR.SYNC", "LDL", "STL")


class Capture:
    """Stands in for a JITFunction: ``fn[grid](*args, **kwargs)`` appends (fn, grid, args, kwargs)."""

    def __init__(self, fn, sink):
        self.fn, self.sink = fn, sink

    def __getitem__(self, grid):
        def record(*args, **kwargs):
            self.sink.append((self.fn, grid, args, kwargs))
        return record


def _device_limit_stand_ins(gpu: GPU) -> dict:
    """device_limits' functions as they would answer on ``gpu`` (on meta tensors they answer
    for Hopper, and has_copy_engine says no)."""
    from haloattn.backends.triton import device_limits

    return {
        "shared_memory_limit": lambda device: gpu.shared_limit,
        "tile_shared_budget": lambda device: gpu.shared_limit - device_limits.COMPILER_RESERVE,
        "has_copy_engine": lambda device: gpu.copy_engine,
        "tiles_for_copy_engine": lambda device: gpu.copy_engine,
        "multiprocessors": lambda device: gpu.multiprocessors,
    }


@contextlib.contextmanager
def emulated_device(gpu: GPU):
    """Within the block the Triton backend's launch code sees ``gpu``'s device limits: each
    device_limits function is replaced wherever a backend module holds it (``from .device_limits
    import ...`` binds it in the importing module, which is where the launchers look it up), and
    restored on the way out. Default configs are cached per problem, not per device: the cache is
    emptied on the way in and out, so that none chosen for another GPU is used or outlives it."""
    from haloattn.backends.triton import device_limits, tiles

    package = device_limits.__name__.rpartition(".")[0] + "."
    stand_ins = _device_limit_stand_ins(gpu)
    originals = {name: getattr(device_limits, name) for name in stand_ins}
    replaced = []
    for module in [m for name, m in list(sys.modules.items()) if name.startswith(package) and m is not None]:
        for name, original in originals.items():
            if getattr(module, name, None) is original:
                replaced.append((module, name, original))
                setattr(module, name, stand_ins[name])
    tiles.default_config.cache_clear()
    try:
        yield
    finally:
        for module, name, original in replaced:
            setattr(module, name, original)
        tiles.default_config.cache_clear()


@contextlib.contextmanager
def captured_launches(launcher, gpu: GPU = HOPPER):
    """Within the block, kernel launches (``fast_launch.resolve``) record themselves instead of
    running, and the launch code sees ``gpu``'s device limits (:func:`emulated_device`: on the
    default, Hopper, the configs are the ones the CPU interpreter gets, with the copy engine
    (TMA)); yields the list the launches are appended to. Launch plans are forgotten on the way
    in and out, so that none built while recording outlives the block. ``launcher``, the module
    whose functions launch, is the callers' (the limits are replaced in every backend module)."""
    from haloattn.backends.triton import fast_launch

    sink = []
    saved_resolve = fast_launch.resolve
    fast_launch.clear_plans()
    fast_launch.resolve = lambda fn: Capture(fn, sink)
    try:
        with emulated_device(gpu):
            yield sink
    finally:
        fast_launch.resolve = saved_resolve
        fast_launch.clear_plans()


def specialise(fn, args, kwargs):
    """(signature, constexprs, attrs, options) the JIT would compile for these arguments."""
    names = fn.arg_names
    signature, constexprs, attrs = {}, {}, {}
    values = dict(zip(names, args))
    values.update({k: v for k, v in kwargs.items() if k in names})
    for index, name in enumerate(names):
        value = values[name]
        param = fn.params[index]
        if param.is_constexpr or value is None:  # None: an unused argument, a constant to the JIT
            signature[name], constexprs[name] = "constexpr", value
        elif is_host_descriptor(value):
            signature[name] = mangle_type(value)  # tensordesc<dtype[block shape]>
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


def ptxas_report(ptx: str, capability: int) -> str:
    """ptxas -v's report (registers, spills, warnings) on ``ptx``, from the ptxas Triton uses for
    this target, for the GPU name of the PTX's ``.target`` line (sm_90a, sm_100a, sm_120a: Triton
    builds the arch-specific variants from sm_90 on; sm_80, sm_86, sm_89 as they are)."""
    gpu_name = re.search(r"^\s*\.target\s+(\w+)", ptx, re.MULTILINE).group(1)
    return subprocess.run([get_ptxas(capability).path, "-v", "--gpu-name", gpu_name, "-o", os.devnull, "-"],
                          input=ptx, capture_output=True, text=True).stderr


def _build(src, options: dict, capability: int):
    """(compiled kernel, ptxas -v report, registers a thread) of one build for ``sm_{capability}``."""
    kernel = triton.compile(src, target=GPUTarget("cuda", capability, 32), options=options)
    info = ptxas_report(kernel.asm["ptx"], capability)
    m = re.search(r"Used (\d+) registers", info)
    return kernel, info, int(m.group(1)) if m else None


def compile_captured(fn, args, kwargs, label, sass_dir=None, ttgir_dir=None, capability: int = 90) -> dict:
    """Build one captured launch for ``sm_{capability}`` (default sm_90) and print (and return)
    what the compiler made."""
    from haloattn.backends.triton import device_limits

    signature, constexprs, attrs, options = specialise(fn, args, kwargs)
    src = triton.compiler.ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    kernel, info, regs = _build(src, options, capability)
    # As the launcher does on the GPU (fast_launch.Launch): a degenerate build is rebuilt capped.
    m = re.search(r"(\d+) bytes stack frame", info)
    rebuilt = ("maxnreg" not in options and regs is not None and m is not None
               and device_limits.built_degenerately(regs, int(m.group(1))))
    if rebuilt:
        options = dict(options, maxnreg=device_limits.MAX_REGISTERS)
        kernel, info, regs = _build(src, options, capability)
    ptx = kernel.asm["ptx"]
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
    row = dict(label=label, capability=capability, warps=options.get("num_warps"), rebuilt=rebuilt,
               stages=options.get("num_stages", kwargs.get("NUM_STAGES")),
               regs=regs, spills=spills, shared=kernel.metadata.shared,
               cp_async=ptx.count("cp.async.cg") + ptx.count("cp.async.ca"), **counts)
    ops = " ".join(f"{k}={v}" for k, v in counts.items() if v)
    row["wgmma_serialized"] = serialized
    # wgmma A fragments a loop reads from registers it never writes: see ptx_register_operands.py.
    row["invariant_register_operands"] = len(loop_invariant_register_operands(ptx))
    print(f"{label}: warps {row['warps']} stages {row['stages']} regs {regs}{' (rebuilt capped)' if rebuilt else ''} "
          f"spill-stores {spills}B "
          f"shared {row['shared']}B ptx-cp.async {row['cp_async']}{' WGMMA-SERIALIZED' if serialized else ''} | {ops}",
          flush=True)
    return row
