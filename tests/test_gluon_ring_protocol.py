"""The barrier protocol of the Gluon split-walk forward (backends/triton/gluon_split_walk_kernel.py)
on CPU: a model of its producer warp and two consumer warpgroups, step for step as the kernel
waits and arrives on its mbarriers, run under many random interleavings (and random TMA landing
times) for streams of every shape and ring depths of 2, 3 and 4 slots.

The kernel itself cannot run without a GPU, and a protocol error there is a hang or a silent
race. The model checks that no interleaving deadlocks, that every wait is for the phase just
ahead of the barrier (never one a full turn away, where a parity wait would be fooled), that
each consumer reads the tile it expects from a slot, and that the copy engine never overwrites
a slot some consumer still reads."""

import random

import pytest


class Barrier:
    """An mbarrier: phases complete after ``count`` arrivals (the ready barriers: the copy's
    landing). ``wait(parity)`` passes once the phase of that parity has completed: the barrier's
    current phase parity differs from it (a fresh barrier passes a wait on parity 1)."""

    def __init__(self, count):
        self.count, self.arrived, self.completed = count, 0, 0

    def arrive(self):
        self.arrived += 1
        assert self.arrived <= self.count
        if self.arrived == self.count:
            self.arrived, self.completed = 0, self.completed + 1

    def passes(self, parity):
        return self.completed % 2 != parity


def _exclusive_owner(t, tiles0, tiles1):
    """gluon_split_walk.exclusive_tile's owner (the index is not needed here)."""
    both = min(tiles0, tiles1)
    return t % 2 if t < 2 * both else int(tiles1 > tiles0)


class Interleaved:
    """Runs a model's producer and two consumers (generators that yield at each step and park on
    barrier waits) one step at a time in a random order, landing the copies in flight at random
    moments, until all finish; a state where every worker waits on a barrier that cannot pass and
    no copy is in flight is a deadlock. A model has ``rng``, ``landing`` (slot key, content, ready
    barrier), ``slots`` and ``readers`` (slot key -> set of consumers reading it)."""

    # the kernel's waits, as generator steps: yield (barrier, parity, the phase it must be)
    def wait(self, barrier, parity):
        while not barrier.passes(parity):
            # the phase awaited is the barrier's next one, never one a whole turn later
            assert barrier.completed % 2 == parity, "a parity wait one turn away"
            yield
        return

    def land(self):
        """One copy in flight lands (any of them: the copy engine keeps no order)."""
        key, tile, ready = self.landing.pop(self.rng.randrange(len(self.landing)))
        assert not self.readers[key], f"a copy overwrote {key} while {self.readers[key]} read it"
        self.slots[key] = tile
        ready.arrive()

    def run(self):
        workers = {"producer": self.producer(), 0: self.consumer(0), 1: self.consumer(1)}
        for _ in range(200000):
            choices = list(workers) + (["land"] * 2 if self.landing else [])
            if not choices:
                break
            pick = self.rng.choice(choices)
            if pick == "land":
                self.land()
                continue
            # a worker blocked on a wait makes no progress this turn, others may
            try:
                next(workers[pick])
            except StopIteration:
                del workers[pick]
            if workers and not self.landing and all(_blocked(self, w) for w in workers.values()):
                raise AssertionError("deadlock")
        assert not workers, "did not finish"


class Model(Interleaved):
    def __init__(self, exclusive0, exclusive1, shared, stages, rng):
        self.rng, self.stages = rng, stages
        self.exclusive, self.shared = (exclusive0, exclusive1), shared
        self.total = exclusive0 + exclusive1 + shared
        self.owners = [_exclusive_owner(t, exclusive0, exclusive1) for t in range(exclusive0 + exclusive1)]
        self.owners += [2] * shared
        self.k_ready, self.v_ready = [Barrier(1) for _ in range(stages)], [Barrier(1) for _ in range(stages)]
        self.k_empty, self.v_empty = [Barrier(2) for _ in range(stages)], [Barrier(2) for _ in range(stages)]
        self.slots = {("k", s): None for s in range(stages)} | {("v", s): None for s in range(stages)}
        self.readers = {key: set() for key in self.slots}
        self.landing = []  # copies in flight: (slot key, tile, ready barrier)
        self.computed = {0: [], 1: []}

    def read(self, who, kind, slot, tile):
        assert self.slots[(kind, slot)] == tile, f"consumer {who} read {kind} of the wrong tile"
        self.readers[(kind, slot)].add(who)

    def release(self, who, kind, slot):
        self.readers[(kind, slot)].discard(who)
        (self.k_empty if kind == "k" else self.v_empty)[slot].arrive()

    def producer(self):
        for i in range(self.total):
            slot, phase = i % self.stages, ((i // self.stages) & 1) ^ 1
            for kind, empty, ready in (("k", self.k_empty, self.k_ready), ("v", self.v_empty, self.v_ready)):
                yield from self.wait(empty[slot], phase)
                self.landing.append(((kind, slot), i, ready[slot]))

    def consumer(self, half):
        s = self.stages
        # exclusive phase: own tiles at once, the other half's released as they land
        for t in range(self.exclusive[0] + self.exclusive[1]):
            slot, phase = t % s, (t // s) & 1
            yield from self.wait(self.k_ready[slot], phase)
            if self.owners[t] == half:
                self.read(half, "k", slot, t)
                yield  # S = Q K^T
                self.release(half, "k", slot)
                yield from self.wait(self.v_ready[slot], phase)
                self.read(half, "v", slot, t)
                yield  # O += P V
                self.computed[half].append(t)
            else:
                self.release(half, "k", slot)
                yield from self.wait(self.v_ready[slot], phase)
            self.release(half, "v", slot)
        if not self.shared:
            return
        # shared phase, pipelined: S of tile i issued before O += P V of tile i - 1
        first = self.exclusive[0] + self.exclusive[1]
        slot = first % s
        yield from self.wait(self.k_ready[slot], (first // s) & 1)
        self.read(half, "k", slot, first)
        yield
        self.release(half, "k", slot)
        for i in range(first + 1, self.total):
            slot, prev = i % s, (i - 1) % s
            yield from self.wait(self.k_ready[slot], (i // s) & 1)
            self.read(half, "k", slot, i)
            yield from self.wait(self.v_ready[prev], ((i - 1) // s) & 1)
            self.read(half, "v", prev, i - 1)
            yield  # both products in flight; S first
            self.release(half, "k", slot)
            yield  # P V done
            self.computed[half].append(i - 1)
            self.release(half, "v", prev)
        last = (self.total - 1) % s
        yield from self.wait(self.v_ready[last], ((self.total - 1) // s) & 1)
        self.read(half, "v", last, self.total - 1)
        yield
        self.computed[half].append(self.total - 1)
        self.release(half, "v", last)

def _blocked(model, worker):
    """Whether ``worker`` is parked on a wait that cannot pass (its frame's barrier and parity)."""
    frame = worker.gi_frame
    while frame is not None and frame.f_code.co_name != "wait":
        inner = getattr(worker, "gi_yieldfrom", None)
        if inner is None:
            return False
        worker, frame = inner, inner.gi_frame
    if frame is None:
        return False
    return not frame.f_locals["barrier"].passes(frame.f_locals["parity"])


@pytest.mark.parametrize("stages", (2, 3, 4))
@pytest.mark.parametrize("exclusive0,exclusive1,shared", [
    (0, 0, 7), (3, 3, 5), (5, 2, 4), (1, 6, 1), (4, 4, 0), (6, 0, 3), (0, 5, 2), (2, 2, 1), (7, 7, 9),
])
def test_no_interleaving_deadlocks_or_races(exclusive0, exclusive1, shared, stages):
    expected = {0: list(range(exclusive0 + exclusive1)), 1: list(range(exclusive0 + exclusive1))}
    for seed in range(40):
        model = Model(exclusive0, exclusive1, shared, stages, random.Random(seed))
        model.run()
        for half in (0, 1):
            own = [t for t in expected[half] if model.owners[t] == half]
            shared_tiles = list(range(exclusive0 + exclusive1, model.total))
            assert model.computed[half] == own + shared_tiles


def test_the_model_finds_a_deadlock():
    """Holding a slot across the other half's tiles (what the exclusive phase avoids by computing
    its own tiles at once) deadlocks once the ring comes round: the model must say so."""

    class Holding(Model):
        def consumer(self, half):
            held = None
            for t in range(self.total):
                slot, phase = t % self.stages, (t // self.stages) & 1
                yield from self.wait(self.k_ready[slot], phase)
                self.release(half, "k", slot)
                yield from self.wait(self.v_ready[slot], phase)
                if self.owners[t] in (half, 2):
                    if held is not None:
                        self.release(half, "v", held)
                    held = slot
                else:
                    self.release(half, "v", slot)
            if held is not None:
                self.release(half, "v", held)

    with pytest.raises(AssertionError, match="deadlock|did not finish"):
        for seed in range(40):
            Holding(6, 6, 0, 2, random.Random(seed)).run()
