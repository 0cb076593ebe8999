"""Host side of the Gluon forward (gluon_forward_kernel.py): which calls take it, and its launch.

A config's forward names the kernel with ``"gluon": True`` (tiles.gluon_forward_chosen picks it
by the cost model; tuning weighs it against the Triton forwards). The problem then suits it
(tiles.gluon_forward_problem); whether the call's tensors do is decided here, once per launch
plan: the Triton forward of the same config runs where they do not (read by pointers that take
any strides), which is the kernel the config names besides, never a slower stand-in.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from haloattn.problem import Problem

from . import tiles
from .descriptor_scratch import ensure_allocator
from .device_limits import multiprocessors, tile_shared_budget
from .gluon_descriptors import grid_descriptor, tensors_fit
from .gluon_regroup import regrouped
from .gluon_schedule import persistent_schedule
from .host_descriptors import rebased
from .launch import _pad3

try:  # Gluon is experimental: a Triton that moved it runs the Triton forward instead
    from .gluon_forward_kernel import CONSUMERS, gluon_forward_kernel
    from .gluon_split_walk_kernel import gluon_split_walk_kernel
except (ImportError, AttributeError):  # pragma: no cover - depends on the installed Triton
    gluon_forward_kernel = gluon_split_walk_kernel = None

LOG2E = 1.4426950408889634  # (a float: scores.LOG2E is a tl.constexpr, which a launch would specialise on)
# setmaxnreg: the producer warp keeps 32 registers a thread (its walk bookkeeping spilled at 24:
# the split walk's stream, the whole walk's boxes of a persistent program), each consumer
# warpgroup takes 240 (the 64K of a multiprocessor: 2 x 128 x 240 + 128 x 32).
PRODUCER_REGISTERS, CONSUMER_REGISTERS = 32, 240
WARPS = 4  # the default partition (the first consumer); the workers add 4 + 1 warps


def _capturing(q: torch.Tensor) -> bool:
    """Whether this plan is made inside a CUDA graph's capture (its first call of the problem, not
    warmed up first): the persistent grid's schedule, copied from the host, cannot be made there,
    so that plan keeps a program a box."""
    return q.is_cuda and torch.cuda.is_current_stream_capturing()


def persistent_query_slots(problem: Problem, q: torch.Tensor, ring_slots: int, key_tokens: int,
                           split_walk: bool) -> int:
    """Query slots a consumer of the whole walk's kernel takes: two where tiles.GLUON_PERSISTENT
    asks for a persistent grid and a second box's queries fit beside the ring (and the plan is not
    made during a CUDA graph's capture), else one (and a program a box). The split walk's kernel
    is never persistent."""
    if split_walk or not tiles.GLUON_PERSISTENT or _capturing(q):
        return 1
    row = problem.head_dim * q.element_size()
    ring = 2 * ring_slots * key_tokens * row
    return 2 if ring + 2 * tiles.GLUON_FORWARD_TOKENS * row <= tile_shared_budget(q.device) else 1


def inputs_fit(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether this call's tensors can run the Gluon forward (the problem already suits it)."""
    return gluon_forward_kernel is not None and tensors_fit(q, k, v)


class GluonForward:
    """One launch plan: the grid, the descriptors (built for the first call's tensors, rebased
    onto each later call's: the plan's key fixes their layouts) and the scalar arguments."""

    def __init__(self, problem: Problem, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                 lse: torch.Tensor, exp2_every: int = 0):
        """``problem`` undilated (a dilated one's regrouping, with views of the tensors: later calls
        pass the original tensors, whose data the descriptors are rebased onto); ``exp2_every``:
        the config's ``"exp2_split"`` (exp2_split.py)."""
        tiling = tiles.gluon_forward_boxes(problem)
        rank = problem.rank
        q_box, kv_box = _pad3(tiling.q, 1), _pad3(tiling.kv, 1)
        # the consumers' halves: the box cut along the axis the cost model chose (as an axis of
        # the kernel's three, which _pad3 fills from the front)
        self.split = tiling.split + 3 - rank
        half = list(q_box)
        half[self.split] //= CONSUMERS
        axes = problem.axes
        lengths = _pad3([a.length for a in axes], 1)
        boxes = [-(-n // t) for n, t in zip(lengths, q_box)]
        items = boxes[0] * boxes[1] * boxes[2] * problem.heads * problem.batch
        slots = tiles.GLUON_RING_SLOTS[tiling.split_walk, math.prod(kv_box)]
        query_slots = persistent_query_slots(problem, q, slots, math.prod(kv_box), tiling.split_walk)
        # a persistent grid: a program a multiprocessor, each walking its row of boxes of the
        # schedule (its next box's queries and first tiles load while it finishes a box); else a
        # program a box
        persistent = query_slots == 2
        programs = min(items, tiles.GLUON_PERSISTENT_PROGRAMS or multiprocessors(q.device)) if persistent else items
        self.grid = (programs, )
        if persistent:
            table = persistent_schedule(problem, tiling.q, tiling.kv, programs, q.device)
            self.schedule = [table, table.shape[1]]
        else:
            self.schedule = [torch.zeros(1, dtype=torch.int32, device=q.device), 0]
        self.descriptors = [grid_descriptor(q, rank, half), grid_descriptor(k, rank, kv_box),
                            grid_descriptor(v, rank, kv_box), grid_descriptor(out, rank, half)]
        lse_strides = list(lse.stride())
        self.scalars = [lse_strides[0], *_pad3(lse_strides[1:1 + rank], 0), lse_strides[-1], *lengths,
                        *_pad3([a.window for a in axes], 1), *_pad3([a.stride for a in axes], 1),
                        *_pad3([a.shift for a in axes], 0), boxes[1], boxes[2], problem.heads // problem.kv_heads,
                        problem.scale * LOG2E, boxes[0] * boxes[1] * boxes[2], problem.heads]
        causal = _pad3([a.causal for a in axes], False)
        self.meta = dict(C0=causal[0], C1=causal[1], C2=causal[2], WINDOW=problem.pattern == "window", RANK=rank,
                         STAGES=slots, SPLIT=self.split, EXP2_EVERY=exp2_every, PRODUCER_REGS=PRODUCER_REGISTERS,
                         CONSUMER_REGS=CONSUMER_REGISTERS, num_warps=WARPS)
        # the split walk's kernel (each consumer computes only its half's key tiles), else the
        # whole walk's
        self.kernel = gluon_split_walk_kernel if tiling.split_walk else gluon_forward_kernel
        if tiling.split_walk:
            self.meta.update(SPLIT_CAUSAL=causal[self.split])
        else:
            self.meta.update(QBUFS=query_slots, PERSISTENT=persistent)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                 lse: torch.Tensor) -> None:
        descriptors = [rebased(template, t) for template, t in zip(self.descriptors, (q, k, v, out))]
        ensure_allocator()
        self.kernel[self.grid](*self.arguments(descriptors, lse), **self.meta)

    def arguments(self, descriptors: list, lse: torch.Tensor) -> list:
        """The kernel's arguments before its constexprs (the whole walk's end with its schedule)."""
        return [*descriptors, lse, *self.scalars] + ([] if self.kernel is gluon_split_walk_kernel else self.schedule)


def plan(problem: Problem, fwd: dict, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
         lse: torch.Tensor) -> Optional[GluonForward]:
    """The Gluon launch for this forward config and call, or None where the config names the
    Triton forward or the tensors do not suit the Gluon kernel. A dilated problem runs as its
    undilated regrouping over views of the tensors (gluon_regroup.py)."""
    if not (fwd.get("gluon") and tiles.gluon_forward_problem(problem) and tiles.gluon_forward_boxes(problem)):
        return None
    regrouping = regrouped(problem)
    views = [regrouping.view(t) for t in (q, k, v, out)] + [regrouping.view_rows(lse)]
    if any(t is None for t in views) or not inputs_fit(*views[:3]):
        return None
    return GluonForward(regrouping.problem, *views,
                        exp2_every=fwd.get("exp2_split", 0) if tiles.GLUON_EXP2_SPLIT else 0)
