"""What a GPU offers a kernel (shared memory per block, a tensor copy engine), for choosing launch
configs that fit the device at hand.

The kernels' default tiles were measured on Hopper (227 KiB of shared memory per block); an
Ampere A100 allows 163 KiB and an RTX 30xx/40xx or L4 only 99 KiB, where a Hopper-sized config
would fail at launch with Triton's OutOfResources instead of running with smaller tiles.
"""

from __future__ import annotations

from functools import lru_cache

import torch

# Shared memory the tile estimates leave to the compiler (reductions, layout conversions,
# barriers): on Hopper this keeps the budget the H100 sweeps were measured with (200 KiB).
COMPILER_RESERVE = 27 * 1024
# Budget where there is no GPU to ask (the CPU interpreter): Hopper's, so configs match the GPU's.
HOPPER_TILE_BUDGET = 227 * 1024 - COMPILER_RESERVE


def shared_memory_limit(device) -> int:
    """Shared memory one block may use on this GPU (opt-in maximum)."""
    properties = torch.cuda.get_device_properties(device)
    limit = getattr(properties, "shared_memory_per_block_optin", 0)
    if limit:
        return limit
    # Older torch: the CUDA programming guide's per-block maxima by compute capability.
    return {(9, 0): 227, (8, 0): 163, (8, 7): 163}.get((properties.major, properties.minor), 99) * 1024


@lru_cache(maxsize=64)
def _cuda_tile_budget(device: torch.device) -> int:
    return shared_memory_limit(device) - COMPILER_RESERVE


def tile_shared_budget(device: torch.device) -> int:
    """Bytes of shared memory the operand tiles of one program may take on ``device``."""
    if device.type == "cuda" and torch.cuda.is_available():
        return _cuda_tile_budget(device)
    return HOPPER_TILE_BUDGET


# SMs where there is no GPU to ask (the CPU interpreter): an H100's, so configs match the GPU's.
HOPPER_MULTIPROCESSORS = 132


@lru_cache(maxsize=64)
def _cuda_multiprocessors(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def multiprocessors(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device (HOPPER_MULTIPROCESSORS elsewhere)."""
    if device.type == "cuda" and torch.cuda.is_available():
        return _cuda_multiprocessors(device)
    return HOPPER_MULTIPROCESSORS


# Registers a thread may hold (ptx ``.maxnreg``), for rebuilding a kernel ptxas built degenerately.
MAX_REGISTERS = 255
# Left to itself ptxas (CUDA 12.8 as Triton bundles it, and 13.0) picks a register count by its own
# occupancy rule (168 on sm_90 for a forward that would take 215, say). But a kernel that needs
# more than 255 it sometimes builds with 32-40 registers and the rest on the stack: on sm_80 the
# float32 Swin-window backward spilled 13.5 KB a thread where sm_86 / sm_89 / sm_90 builds of the
# same kernel spilled 0.9-1.9 KB at 255 registers, long-window kernels up to 320 KB; sm_89 (with 40)
# to float32 windows and 128-slot windows at head dim 128. Capped at 255 those kernels take 255
# and spill as the sm_90 builds do (RESULTS.md, "Degenerate register allocation"). A cap
# on every kernel would move ptxas off its occupancy choice everywhere, so only degenerate builds
# are rebuilt (fast_launch.Launch; the compile tests do the same: sm90_compile.compile_captured).
DEGENERATE_REGISTERS = 128


def built_degenerately(registers: int, local_bytes: int) -> bool:
    """Whether a kernel was built with few registers and the rest in local memory: fewer than
    DEGENERATE_REGISTERS registers a thread while it spills (no sane allocation spills with half
    the register file free)."""
    return local_bytes > 0 and registers < DEGENERATE_REGISTERS


def has_copy_engine(device: torch.device) -> bool:
    """Hopper (sm_90) and newer copy tensor tiles with TMA."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9


def tiles_for_copy_engine(device: torch.device) -> bool:
    """Whether default tiles should be the ones measured with TMA loads: on Hopper and newer, and
    where there is no GPU to ask (the CPU interpreter runs the descriptor path too)."""
    if device.type == "cuda" and torch.cuda.is_available():
        return has_copy_engine(device)
    return True


def hopper_for_gluon(device: torch.device) -> bool:
    """Whether default configs should choose the Gluon forward (gluon_forward_kernel.py): on an
    sm_90 GPU (its wgmma instructions are Hopper's alone), and where there is no GPU to ask, so
    that the CPU interpreter's configs match the GPU's (the interpreter then runs the Triton
    forward the config also names)."""
    if device.type == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_capability(device)[0] == 9
    return True
