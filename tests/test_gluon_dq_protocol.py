"""The barrier protocol of the Gluon dQ pass (backends/triton/gluon_dq_kernel.py) on CPU: a model of
its producer warp and two consumer warpgroups over a persistent program's row of boxes, wait for
wait and arrive for arrive, under many random interleavings (and random TMA landing times), for
rows of boxes of every walk length and ring depths of 2 to 4 slots.

What differs from the forward's protocol (test_gluon_persistent_protocol.py): a consumer's K slot
is read by two products, the tile's S and the dQ += dS K issued at the next step, so it is
released only once that product is done (one step after its V slot, which dP alone reads); and
the query and dO halves of a box share one slot a consumer and one ready barrier, handed back
once dQ, stored through the query slot, has left. The model checks that no interleaving
deadlocks, that every wait is for the phase just ahead of its barrier, that each product reads
the tile it expects, and that no copy lands in a slot a product still reads."""

import random

import pytest

from test_gluon_persistent_protocol import CONSUMERS, SlotModel
from test_gluon_ring_protocol import Barrier


class DQModel(SlotModel):
    """One persistent program: ``walks[b]`` key tiles in box b, ``stages`` ring slots."""

    release_k_with_s = False  # (the mutation the last test makes: each K slot released once its S is done)

    def __init__(self, walks, stages, rng):
        self.rng, self.walks, self.stages = rng, walks, stages
        self.k_ready, self.v_ready = [Barrier(1) for _ in range(stages)], [Barrier(1) for _ in range(stages)]
        self.k_empty, self.v_empty = ([Barrier(CONSUMERS) for _ in range(stages)] for _ in range(2))
        self.q_ready, self.q_empty = [Barrier(1) for _ in range(CONSUMERS)], [Barrier(1) for _ in range(CONSUMERS)]
        self.slots = ({("k", s): None for s in range(stages)} | {("v", s): None for s in range(stages)}
                      | {("q", h): None for h in range(CONSUMERS)})
        self.readers = {key: set() for key in self.slots}
        self.landing = []  # copies in flight: (slot key, content, ready barrier)
        self.products = {half: [] for half in range(CONSUMERS)}  # (product, box, tile) as each is issued
        self.stored = {half: [] for half in range(CONSUMERS)}

    def producer(self):
        position = 0
        for box, tiles in enumerate(self.walks):
            for half in range(CONSUMERS):
                yield from self.wait(self.q_empty[half], (box & 1) ^ 1)
                # the query and dO halves: two copies, one ready barrier (its expected bytes both's)
                self.landing.append((("q", half), (box, half), self.q_ready[half]))
            yield from self.land_walk(position, tiles)
            position += tiles

    def _step(self, who, box, i, first):
        """Step i: (after the box's first step) dQ += dS K of tile i - 1 issued, then S and dP of
        tile i; S and the previous dQ waited for (K of tile i - 1 released), then dP (V of tile i
        released)."""
        s = self.stages
        yield from self.wait(self.k_ready[i % s], (i // s) & 1)
        if not first:
            self.read(who, ("k", (i - 1) % s), i - 1)  # still held since its S
            self.products[who].append(("dq", box, i - 1))
        self.read(who, ("k", i % s), i)
        self.products[who].append(("s", box, i))
        yield from self.wait(self.v_ready[i % s], (i // s) & 1)
        self.read(who, ("v", i % s), i)
        self.products[who].append(("dp", box, i))
        yield  # the products in flight
        if not first:
            self.release(who, ("k", (i - 1) % s), self.k_empty[(i - 1) % s])
        yield  # P under dP, then dP done
        self.release(who, ("v", i % s), self.v_empty[i % s])

    def consumer(self, who):
        s = self.stages
        position = 0
        for box, tiles in enumerate(self.walks):
            yield from self.wait(self.q_ready[who], box & 1)
            self.read(who, ("q", who), (box, who))
            for i in range(position, position + tiles):
                yield from self._step(who, box, i, first=i == position)
            position += tiles
            last = (position - 1) % s
            self.read(who, ("k", last), position - 1)
            self.products[who].append(("dq", box, position - 1))
            yield  # the last dQ product, waited for
            if not self.release_k_with_s:
                self.release(who, ("k", last), self.k_empty[last])
            self.slots[("q", who)] = ("dq", box, who)  # dQ leaves through the query slot
            yield  # its TMA store, waited for
            assert self.slots[("q", who)] == ("dq", box, who), f"a copy overwrote the dQ of box {box}"
            self.stored[who].append(box)
            self.release(who, ("q", who), self.q_empty[who])


ROWS = [[1], [5], [3, 1, 4], [1, 1, 1, 1, 1], [2, 7, 1, 3, 2, 6], [9, 9, 9], [4, 1, 8, 2, 2, 1, 5, 3]]


def expected_products(walks):
    """Per box its tiles' S and dP, each tile's dQ product issued at the next step or at the end."""
    out, position = [], 0
    for box, tiles in enumerate(walks):
        for i in range(position, position + tiles):
            if i > position:
                out.append(("dq", box, i - 1))
            out += [("s", box, i), ("dp", box, i)]
        out.append(("dq", box, position + tiles - 1))
        position += tiles
    return out


@pytest.mark.parametrize("stages", (2, 3, 4))
@pytest.mark.parametrize("walks", ROWS)
def test_no_interleaving_deadlocks_or_races(walks, stages):
    """Each consumer issues every product of every box, in order, and stores each box's dQ once."""
    for seed in range(40):
        model = DQModel(walks, stages, random.Random(seed))
        model.run()
        for half in range(CONSUMERS):
            assert model.products[half] == expected_products(walks)
            assert model.stored[half] == list(range(len(walks)))


def test_the_model_finds_a_k_slot_released_before_its_dq_product():
    """Releasing K once its S is done lets the producer load a later tile over it while the next
    step's dQ product still has to read it: the model must say so."""

    class Early(DQModel):
        release_k_with_s = True

        def _step(self, who, box, i, first):
            # the kernel's step with K's release moved to its own S: the next step's dQ product
            # then reads a slot nobody holds
            s = self.stages
            yield from self.wait(self.k_ready[i % s], (i // s) & 1)
            if not first:
                self.read(who, ("k", (i - 1) % s), i - 1)
                self.readers[("k", (i - 1) % s)].discard(who)
            self.read(who, ("k", i % s), i)
            yield from self.wait(self.v_ready[i % s], (i // s) & 1)
            self.read(who, ("v", i % s), i)
            yield
            self.release(who, ("k", i % s), self.k_empty[i % s])
            yield
            self.release(who, ("v", i % s), self.v_empty[i % s])

    with pytest.raises(AssertionError, match="read"):
        for seed in range(60):
            Early([3, 4, 2, 5], 2, random.Random(seed)).run()
