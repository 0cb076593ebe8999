"""Which query boxes each program of the Gluon forward's persistent grid walks, and in what order.

A persistent program (one a multiprocessor) walks several boxes, loading the next box's queries
and first key tiles while it finishes one. Its boxes are fixed before the launch, so the grid
takes as long as its busiest program. Dealt out round-robin (program p taking boxes p, p + P, ...)
the boxes of a 2-D or 3-D neighbourhood are not alike: a box at the grid's edge walks fewer key
tiles, and the round-robin stride lands some programs on edge boxes again and again while others
get only interior ones. On the H100 that left the busiest program 1.09-1.29x the mean on the
issue's 2-D and 3-D rows, and the persistent grid ran 0.93-0.96x a grid of one program a box,
whose free multiprocessors take the next box as they finish one (RESULTS.md, "The persistent
Gluon forward").

So the host deals each round of P consecutive boxes (which keeps the grid's working set of keys
and values what a grid of one program a box would have in flight) heaviest first to the programs
with the least work so far, weighing a box by the key tiles it walks plus its own set-up
(``BOX_STEPS``). The kernel reads its boxes from the table ``schedule`` returns.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import torch

from haloattn.problem import Problem

from .tiles import ANCHOR_TILES, axis_tile_steps

# A box's own work besides its key tiles, in key-tile steps: loading its queries, the last
# product, the output's store (what tiles.GLUON_PROGRAM_STEPS charges a grid of a program a box).
BOX_STEPS = 1.0
# Rounds dealt by weight; beyond them (very large problems, where the host's loop would cost more
# than the imbalance) the boxes go round-robin.
BALANCED_ROUNDS = 4096


def box_steps(problem: Problem, q_box: Sequence[int], kv_box: Sequence[int]) -> np.ndarray:
    """Key tiles each query box of one (batch, head) walks (index_math.key_walk's steps, as the
    cost model counts them per axis: tiles.axis_tile_steps), in the kernel's box order
    (row-major over the grid's boxes). ``problem`` is undilated, as the Gluon forward's are."""
    steps = np.ones(1, dtype=np.int64)
    for axis, q_tile, kv_tile in zip(problem.axes, q_box, kv_box):
        per_box = [n for n, _ in axis_tile_steps(axis, problem.pattern, q_tile, kv_tile, ANCHOR_TILES)]
        steps = np.multiply.outer(steps, np.array(per_box, dtype=np.int64)).ravel()
    return steps


def schedule(costs: np.ndarray, programs: int) -> np.ndarray:
    """The persistent grid's table for work items of these costs (in the kernel's item order):
    row p is program p's count of items, then its items in the order it walks them. Each round
    of ``programs`` consecutive items goes heaviest first to the programs with the least work."""
    items = len(costs)
    rounds = -(-items // programs)
    table = np.zeros((programs, rounds + 1), dtype=np.int32)
    if rounds > BALANCED_ROUNDS:
        order = np.arange(rounds * programs).reshape(rounds, programs).T
        table[:, 1:] = order
        table[:, 0] = (order < items).sum(axis=1)
        return table
    load = np.zeros(programs)
    for r in range(rounds):
        chunk = costs[r * programs:(r + 1) * programs]
        heaviest = np.argsort(-chunk, kind="stable")
        least_loaded = np.argsort(load, kind="stable")[:len(chunk)]
        table[least_loaded, 1 + r] = r * programs + heaviest
        table[least_loaded, 0] += 1
        load[least_loaded] += chunk[heaviest]
    return table


def persistent_schedule(problem: Problem, q_box: Sequence[int], kv_box: Sequence[int], programs: int,
                        device: torch.device) -> torch.Tensor:
    """``schedule``'s table for the Gluon forward's boxes of ``problem`` (every batch and head,
    boxes fastest), as int32 on ``device``."""
    per_head = box_steps(problem, q_box, kv_box) + BOX_STEPS
    costs = np.tile(per_head, problem.heads * problem.batch)
    return torch.from_numpy(schedule(costs, programs)).to(device)


def busiest_over_mean(costs: np.ndarray, table: np.ndarray) -> float:
    """The busiest program's work over the mean (1 is a perfect balance)."""
    loads = [costs[row[1:1 + row[0]]].sum() for row in table]
    return max(loads) / (sum(loads) / len(loads)) if math.fsum(loads) else 1.0
