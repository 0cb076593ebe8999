"""Host side of the Gluon dQ pass (gluon_dq_kernel.py): which calls take it, and its launch.

A config's dQ part names the kernel with ``"gluon": True`` (tiles.gluon_dq_chosen). Its boxes are
then the Gluon forward's whole walk (tiles.gluon_dq_boxes), not the part's own tiles, which the
Triton dQ kernel takes where the call's tensors do not suit the Gluon one (heads not back to
back, unaligned strides, more than 2^31 elements) or where the backward needs more of the pass
than dQ and the statistics (the dS rows of a bias gradient: the problem then has a bias, which
the Gluon kernels leave out anyway).
"""

from __future__ import annotations

from typing import Optional

import torch

from haloattn.problem import Problem

from . import tiles
from .descriptor_scratch import ensure_allocator
from .device_limits import multiprocessors
from .gluon_descriptors import grid_descriptor, tensors_fit
from .gluon_forward_launch import LOG2E, _capturing
from .gluon_schedule import persistent_schedule
from .host_descriptors import rebased
from .launch import _pad3, token_strides

try:  # Gluon is experimental: a Triton that moved it runs the Triton dQ kernel instead
    from .gluon_dq_kernel import gluon_dq_kernel
    from .gluon_forward_kernel import CONSUMERS
except (ImportError, AttributeError):  # pragma: no cover - depends on the installed Triton
    gluon_dq_kernel = None

# setmaxnreg as the forward's (gluon_forward_launch.py): 32 for the producer warp's walk
# bookkeeping, 240 a consumer thread.
PRODUCER_REGISTERS, CONSUMER_REGISTERS = 32, 240
WARPS = 4  # the default partition (the first consumer); the workers add 4 + 1 warps
# The tensors the launch reads and writes, in its call's order (launch._backward_launches names).
TENSORS = ("q", "k", "v", "do", "out", "lse", "dlse", "stats", "dq")


class GluonDQ:
    """One launch plan: the grid (and a persistent grid's schedule), the descriptors (built for the
    first call's tensors, rebased onto each later call's: the plan's key fixes their layouts) and
    the scalar arguments."""

    kernel = gluon_dq_kernel  # (launch._start names the kernel of a launch that ran out of memory)

    def __init__(self, problem: Problem, q, k, v, do, out, lse, dlse, stats, dq):
        tiling = tiles.gluon_dq_boxes(problem)
        rank = problem.rank
        q_box, kv_box = _pad3(tiling.q, 1), _pad3(tiling.kv, 1)
        # the consumers' halves: the box cut along the axis the cost model chose (as an axis of
        # the kernel's three, which _pad3 fills from the front)
        split = tiling.split + 3 - rank
        half = list(q_box)
        half[split] //= CONSUMERS
        lengths = _pad3([a.length for a in problem.axes], 1)
        boxes = [-(-n // t) for n, t in zip(lengths, q_box)]
        items = boxes[0] * boxes[1] * boxes[2] * problem.heads * problem.batch
        persistent = tiles.GLUON_DQ_PERSISTENT and not _capturing(q)
        if persistent:
            programs = min(items, tiles.GLUON_PERSISTENT_PROGRAMS or multiprocessors(q.device))
            table = persistent_schedule(problem, tiling.q, tiling.kv, programs, q.device)
            self.grid, self.schedule = (programs, ), [table, table.shape[1]]
        else:
            self.grid, self.schedule = (items, ), [torch.zeros(1, dtype=torch.int32, device=q.device), 0]
        self.descriptors = [grid_descriptor(q, rank, half), grid_descriptor(do, rank, half),
                            grid_descriptor(k, rank, kv_box), grid_descriptor(v, rank, kv_box),
                            grid_descriptor(dq, rank, half)]
        self.has_dlse = dlse is not None
        self.scalars = [*token_strides(out, rank), *token_strides(lse, rank), *token_strides(stats, rank), *lengths,
                        *_pad3([a.window for a in problem.axes], 1), *_pad3([a.stride for a in problem.axes], 1),
                        *_pad3([a.shift for a in problem.axes], 0), boxes[1], boxes[2],
                        problem.heads // problem.kv_heads, problem.scale * LOG2E, problem.scale,
                        boxes[0] * boxes[1] * boxes[2], problem.heads]
        causal = _pad3([a.causal for a in problem.axes], False)
        self.meta = dict(C0=causal[0], C1=causal[1], C2=causal[2], WINDOW=problem.pattern == "window", RANK=rank,
                         STAGES=tiles.GLUON_DQ_RING_SLOTS[problem.head_dim], SPLIT=split, PERSISTENT=persistent,
                         HAS_DLSE=self.has_dlse, EXP_FIRST=rank <= tiles.GLUON_DQ_EXP_FIRST_MAX_RANK,
                         PRODUCER_REGS=PRODUCER_REGISTERS,
                         CONSUMER_REGS=CONSUMER_REGISTERS, num_warps=WARPS)

    def __call__(self, q, k, v, do, out, lse, dlse, stats, dq) -> None:
        descriptors = [rebased(template, t) for template, t in zip(self.descriptors, (q, do, k, v, dq))]
        ensure_allocator()
        gluon_dq_kernel[self.grid](*self.arguments(descriptors, out, lse, dlse, stats), **self.meta)

    def arguments(self, descriptors: list, out, lse, dlse, stats) -> list:
        """The kernel's arguments before its constexprs (dLSE: the LSE where the call has none,
        which the kernel then does not read)."""
        return [*descriptors, out, lse, dlse if self.has_dlse else lse, stats, *self.scalars, *self.schedule]


def inputs_fit(*tensors: torch.Tensor) -> bool:
    """Whether this call's tensors can run the Gluon dQ pass (the problem already suits it)."""
    return gluon_dq_kernel is not None and tensors_fit(*tensors)


def plan(problem: Problem, cfg: dict, tensors: dict) -> Optional[GluonDQ]:
    """The Gluon dQ launch for this config part and call, or None where the config names the
    Triton kernel, the problem or the tensors do not suit the Gluon one, or the pass must also
    write a bias gradient's dS rows."""
    chosen = [tensors[name] for name in ("q", "k", "v", "do", "dq")]
    dlse = tensors["dlse"]
    # (the kernel reads dLSE at the LSE's offsets: launch.backward makes both contiguous)
    if not (cfg.get("gluon") and tiles.gluon_dq_problem(problem) and tensors["ds"] is None
            and (dlse is None or dlse.stride() == tensors["lse"].stride())
            and all(t is not None for t in chosen) and inputs_fit(*chosen)):
        return None
    return GluonDQ(problem, *(tensors[name] for name in TENSORS))
