"""Host side of the Gluon dK/dV pass (gluon_dkdv_kernel.py): which calls take it, and its launch.

A config's dK/dV part names the kernel with ``"gluon": True`` (tiles.gluon_dkdv_chosen). Its
tiles are then the Triton kernel's own (a resident box of 64 keys, streamed boxes of 64 queries),
so the problem suits it (tiles.gluon_dkdv_tiles); whether the call's tensors do is decided here,
once per launch plan. Where they do not (heads not back to back, unaligned strides, more than
2^31 elements), the config's Triton dK/dV kernel runs on the same tiles; so it does where the
backward adds dQ in the key-major pass (``atomic_dq``: launch._backward_launches does not ask).
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from haloattn.problem import Problem

from . import tiles
from .descriptor_scratch import ensure_allocator
from .gluon_descriptors import grid_descriptor, tensors_fit
from .gluon_forward_launch import LOG2E
from .host_descriptors import rebased
from .launch import _pad3

try:  # Gluon is experimental: a Triton that moved it runs the Triton dK/dV kernel instead
    from .gluon_dkdv_kernel import gluon_dkdv_kernel
except (ImportError, AttributeError):  # pragma: no cover - depends on the installed Triton
    gluon_dkdv_kernel = None

# Three slots of a query box, its dO box and statistics rows (33 KiB at 128 channels), the key
# box's K and V (32 KiB) and the float32 scratch where the consumers' partial sums meet (64 KiB):
# 195 KiB of a Hopper block's 227; a fourth slot would not fit.
STAGES = 3
PRODUCER_REGISTERS, CONSUMER_REGISTERS = 24, 240
WARPS = 4  # the default partition (the first consumer); the workers add 4 + 1 warps
# The tensors the launch reads and writes, in its call's order (launch._backward_launches names).
TENSORS = ("q", "k", "v", "do", "stats", "dk", "dv")


class GluonKeyMajor:
    """One launch plan: the grid, the descriptors (built for the first call's tensors, rebased
    onto each later call's: the plan's key fixes their layouts) and the scalar arguments."""

    kernel = gluon_dkdv_kernel  # (launch._start names the kernel of a launch that ran out of memory)

    def __init__(self, problem: Problem, cfg: dict, q, k, v, do, stats, dk, dv):
        rank = problem.rank
        q_box, kv_box = _pad3(cfg["q"], 1), _pad3(cfg["kv"], 1)
        axes = problem.axes
        lengths = _pad3([a.length for a in axes], 1)
        boxes = [-(-n // t) for n, t in zip(lengths, kv_box)]
        self.grid = (math.prod(boxes), problem.kv_heads, problem.batch)
        self.descriptors = [grid_descriptor(q, rank, q_box), grid_descriptor(do, rank, q_box),
                            grid_descriptor(stats, rank, q_box)]
        self.descriptors += [grid_descriptor(t, rank, kv_box) for t in (k, v, dk, dv)]
        self.scalars = [*lengths, *_pad3([a.window for a in axes], 1), *_pad3([a.stride for a in axes], 1),
                        *_pad3([a.shift for a in axes], 0), boxes[1], boxes[2], problem.heads // problem.kv_heads,
                        problem.scale * LOG2E, problem.scale]
        causal = _pad3([a.causal for a in axes], False)
        self.meta = dict(C0=causal[0], C1=causal[1], C2=causal[2], WINDOW=problem.pattern == "window", RANK=rank,
                         ANCHOR=bool(cfg.get("anchor", tiles.ANCHOR_TILES)), STAGES=STAGES,
                         PRODUCER_REGS=PRODUCER_REGISTERS, CONSUMER_REGS=CONSUMER_REGISTERS, num_warps=WARPS)

    def __call__(self, q, k, v, do, stats, dk, dv) -> None:
        order = (q, do, stats, k, v, dk, dv)
        descriptors = [rebased(template, t) for template, t in zip(self.descriptors, order)]
        ensure_allocator()
        gluon_dkdv_kernel[self.grid](*descriptors, *self.scalars, **self.meta)


def inputs_fit(*tensors: torch.Tensor) -> bool:
    """Whether this call's tensors can run the Gluon dK/dV pass (the problem already suits it)."""
    return gluon_dkdv_kernel is not None and tensors_fit(*tensors)


def plan(problem: Problem, cfg: dict, tensors: dict) -> Optional[GluonKeyMajor]:
    """The Gluon dK/dV launch for this config part and call, or None where the config names the
    Triton kernel or the tensors do not suit the Gluon one."""
    chosen = [tensors[name] for name in TENSORS]
    if not (cfg.get("gluon") and tiles.gluon_dkdv_tiles(problem, cfg)
            and all(t is not None for t in chosen) and inputs_fit(*chosen)):
        return None
    return GluonKeyMajor(problem, cfg, *chosen)
