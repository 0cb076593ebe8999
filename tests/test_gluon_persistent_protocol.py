"""The barrier protocol of the Gluon forward's whole walk on its persistent grid
(backends/triton/gluon_forward_kernel.py) on CPU: a model of its producer warp and two consumer
warpgroups over a row of boxes, wait for wait and arrive for arrive, under many random
interleavings (and random TMA landing times), for rows of boxes of every walk length and ring
depths of 2 and 3 slots.

What it adds to test_gluon_ring_protocol.py (the split walk, one box a program): the query slots
(two a consumer, each handed back once the output's store has read it) and the consumers' turn
between boxes, where the next box's first S is issued (its queries from the other slot) before
the finished box's last O += P V. The model checks that no interleaving deadlocks, that every
wait is for the phase just ahead of its barrier, that each consumer reads the queries and tiles
it expects, and that no copy lands in a slot (queries, keys or values) a consumer still reads."""

import random

import pytest

from test_gluon_ring_protocol import Barrier, Interleaved

CONSUMERS = 2


class SlotModel(Interleaved):
    """A model whose consumers read slots by key (``slots``: key -> content, ``readers``: key ->
    consumers reading it) and release each with an arrival on its "empty" barrier."""

    def read(self, who, key, content):
        assert self.slots[key] == content, f"consumer {who} read {key} holding {self.slots[key]}, not {content}"
        self.readers[key].add(who)

    def release(self, who, key, barrier):
        self.readers[key].discard(who)
        barrier.arrive()

    def land_walk(self, position, tiles):
        """The producer's K and V copies of a box's ``tiles`` key tiles from ring position
        ``position`` on, each slot once its last tile's readers released it (the kernels'
        _load_walk)."""
        for i in range(position, position + tiles):
            slot, free = i % self.stages, ((i // self.stages) & 1) ^ 1
            for kind, empty, ready in (("k", self.k_empty, self.k_ready), ("v", self.v_empty, self.v_ready)):
                yield from self.wait(empty[slot], free)
                self.landing.append(((kind, slot), i, ready[slot]))


class PersistentModel(SlotModel):
    """One persistent program: ``walks[b]`` key tiles in box b, ``stages`` ring slots,
    ``query_slots`` query slots a consumer."""

    hand_back_before_store = False  # (a mutation the last test makes)

    def __init__(self, walks, stages, query_slots, rng):
        self.rng, self.walks, self.stages, self.query_slots = rng, walks, stages, query_slots
        self.k_ready, self.v_ready = [Barrier(1) for _ in range(stages)], [Barrier(1) for _ in range(stages)]
        self.k_empty, self.v_empty = ([Barrier(CONSUMERS) for _ in range(stages)] for _ in range(2))
        slots = CONSUMERS * query_slots
        self.q_ready, self.q_empty = [Barrier(1) for _ in range(slots)], [Barrier(1) for _ in range(slots)]
        self.slots = ({("k", s): None for s in range(stages)} | {("v", s): None for s in range(stages)}
                      | {("q", s): None for s in range(slots)})
        self.readers = {key: set() for key in self.slots}
        self.landing = []  # copies in flight: (slot key, content, ready barrier)
        self.computed = {half: [] for half in range(CONSUMERS)}  # (box, tile) per finished O += P V
        self.stored = {half: [] for half in range(CONSUMERS)}

    def producer(self):
        position = 0
        for box, tiles in enumerate(self.walks):
            first = (box % self.query_slots) * CONSUMERS
            free = ((box // self.query_slots) & 1) ^ 1
            for half in range(CONSUMERS):
                yield from self.wait(self.q_empty[first + half], free)
                self.landing.append((("q", first + half), (box, half), self.q_ready[first + half]))
            yield from self.land_walk(position, tiles)
            position += tiles

    def _query_slot(self, box, half):
        return ("q", (box % self.query_slots) * CONSUMERS + half)

    def _queries(self, who, box):
        key = self._query_slot(box, who)
        yield from self.wait(self.q_ready[key[1]], (box // self.query_slots) & 1)
        self.read(who, key, (box, who))

    def _step(self, who, i, box_of_i, box_of_previous):
        """Pipelined step i: S of tile i issued, then O += P V of tile i - 1; S waited for
        (its K slot released), then the product (its V slot released)."""
        s = self.stages
        yield from self.wait(self.k_ready[i % s], (i // s) & 1)
        self.read(who, ("k", i % s), i)
        yield from self.wait(self.v_ready[(i - 1) % s], ((i - 1) // s) & 1)
        self.read(who, ("v", (i - 1) % s), i - 1)
        yield  # both products in flight
        self.release(who, ("k", i % s), self.k_empty[i % s])
        yield  # the softmax of tile i, then P V done
        self.computed[who].append((box_of_previous, i - 1))
        self.release(who, ("v", (i - 1) % s), self.v_empty[(i - 1) % s])

    def consumer(self, who):
        s = self.stages
        yield from self._queries(who, 0)
        yield from self.wait(self.k_ready[0], 0)
        self.read(who, ("k", 0), 0)
        yield  # the first S, waited for at once
        self.release(who, ("k", 0), self.k_empty[0])
        position = 0
        for box, tiles in enumerate(self.walks):
            for i in range(position + 1, position + tiles):
                yield from self._step(who, i, box, box)
            position += tiles
            if box + 1 < len(self.walks):  # the turn
                yield from self.turn(who, box, position)
            else:
                last = (position - 1) % s
                yield from self.wait(self.v_ready[last], ((position - 1) // s) & 1)
                self.read(who, ("v", last), position - 1)
                yield
                self.computed[who].append((box, position - 1))
                self.release(who, ("v", last), self.v_empty[last])
            key = self._query_slot(box, who)
            self.slots[key] = ("output", box, who)  # the output goes out through the query slot
            if self.hand_back_before_store:
                self.release(who, key, self.q_empty[key[1]])
            yield  # the output's TMA store, waited for
            assert self.slots[key] == ("output", box, who), f"a copy overwrote the output of box {box}"
            self.stored[who].append(box)
            if not self.hand_back_before_store:
                self.release(who, key, self.q_empty[key[1]])

    def turn(self, who, box, position):
        """The next box's queries, then its first S and this box's last O += P V as one step."""
        yield from self._queries(who, box + 1)
        yield from self._step(who, position, box + 1, box)


ROWS = [[1], [5], [3, 1, 4], [1, 1, 1, 1, 1], [2, 7, 1, 3, 2, 6], [9, 9, 9], [4, 1, 8, 2, 2, 1, 5, 3]]


@pytest.mark.parametrize("stages", (2, 3))
@pytest.mark.parametrize("walks", ROWS)
def test_no_interleaving_deadlocks_or_races(walks, stages):
    """Each consumer computes every tile of every box, in order, and stores each box once."""
    expected = [(box, start + t) for box, (start, tiles) in
                enumerate(zip([sum(walks[:b]) for b in range(len(walks))], walks)) for t in range(tiles)]
    for seed in range(40):
        model = PersistentModel(walks, stages, 2, random.Random(seed))
        model.run()
        for half in range(CONSUMERS):
            assert model.computed[half] == expected
            assert model.stored[half] == list(range(len(walks)))


def test_one_box_a_program_on_one_query_slot():
    """A grid of one program a box (not persistent) has one query slot a consumer."""
    for seed in range(40):
        model = PersistentModel([6], 2, 1, random.Random(seed))
        model.run()
        assert model.computed[0] == model.computed[1] == [(0, t) for t in range(6)]


def test_the_model_finds_a_turn_that_does_not_wait_for_the_queries():
    """A turn that issues the next box's first S without waiting for its queries reads a slot
    still holding an older box's (or nothing): the model must say so."""

    class Hasty(PersistentModel):
        def turn(self, who, box, position):
            self.read(who, self._query_slot(box + 1, who), (box + 1, who))
            yield from self._step(who, position, box + 1, box)

    with pytest.raises(AssertionError, match="read"):
        for seed in range(40):
            Hasty([2, 3, 1, 2], 2, 2, random.Random(seed)).run()


def test_the_model_finds_a_query_slot_handed_back_before_the_store():
    """Handing the query slot back before the output's store has read it lets the producer load
    a later box's queries over the output: the model must say so."""

    class Early(PersistentModel):
        hand_back_before_store = True

    with pytest.raises(AssertionError, match="overwrote"):
        for seed in range(40):
            Early([1, 2, 1, 3, 1, 2], 2, 2, random.Random(seed)).run()
