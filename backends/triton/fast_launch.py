"""Kernel launches whose every argument but the tensors is fixed, started without Triton's binder.

A launch through ``kernel[grid](...)`` binds and specialises all of its 60-90 arguments on every
call (about 70 us of host time on the H100 machine's CPU for the neighbourhood forward), and the
launchers computed those arguments (strides, per-axis geometry, tile constants) afresh each time
(about 80 us more): on small problems the GPU then waits for the host. Starting the compiled
kernel directly took 13 us in the same measurement (RESULTS.md, "Host time per call").

A ``Launch`` holds one launch's grid and arguments with the tensors left out. Its first call goes
through ``kernel[grid]`` (compiling if needed) and keeps the compiled kernel; later calls hand the
new tensors to that compiled kernel. That is only correct while the compiled kernel's
specialisation still holds, and the callers guarantee it: they keep a ``Launch`` per key that
fixes every non-tensor argument and every property Triton specialises tensors on (dtype, device,
16-byte alignment of the address; ``tensor_layout`` gives the last three). Under the CPU
interpreter, with a launch hook installed (profilers) or on a Triton whose compiled kernels lack
the entry point used here, every call takes the ordinary path.
"""

from __future__ import annotations

from typing import Dict, Optional, Sequence

import torch
from triton.runtime.driver import driver

try:  # Triton >= 3.4; older ones take the ordinary path only
    from triton import knobs
except ImportError:
    knobs = None

from .descriptor_scratch import ensure_allocator
from .host_descriptors import is_host_descriptor, rebased
from .device_limits import MAX_REGISTERS, built_degenerately
from .plugin import interpreting

PLAN_CACHE_LIMIT = 1024
_CACHES = []


def tensor_layout(t: Optional[torch.Tensor]):
    """What a launch built for ``t`` depends on beyond its shape: strides, dtype, device and
    whether its address is 16-byte aligned (Triton specialises pointers on that)."""
    if t is None:
        return None
    return t.stride(), t.dtype, t.device, t.data_ptr() % 16 == 0


def plan_cache() -> Dict:
    """A new cache of launch plans, emptied by ``clear_plans``."""
    cache: Dict = {}
    _CACHES.append(cache)
    return cache


def clear_plans() -> None:
    """Forget every launch plan (tools that swap ``resolve`` call this around their swap)."""
    for cache in _CACHES:
        cache.clear()


def cached(cache: Dict, key, build):
    """``cache[key]``, built by ``build()`` on a miss; the cache is emptied when it grows past
    PLAN_CACHE_LIMIT entries (a program cycling through that many problems rebuilds them)."""
    plan = cache.get(key)
    if plan is None:
        if len(cache) >= PLAN_CACHE_LIMIT:
            cache.clear()
        plan = cache[key] = build()
    return plan


def resolve(fn):
    """What a launch indexes with its grid: the kernel, or its interpreted form under the CPU
    interpreter. Tools that record launches instead of running them (benchmarks/sm90_compile.py)
    put their own function here."""
    if interpreting():
        from .interpreter_compat import kernel as interpreted_kernel

        return interpreted_kernel(fn)
    return fn


def config_key(config):
    """Configs are passed around as dicts and never changed in place (the tuning cache and the
    dispatcher hand out the same dict per problem): their identity keys a launch plan, whose
    entry keeps the dict alive so that its id cannot be reused by another."""
    return None if not config else id(config)


def _launch_hooks_installed() -> bool:
    """Whether a profiler (or anyone) hooks kernel launches: Triton 3.6 keeps the hooks in chains
    that are empty by default, older releases in attributes that are None by default."""
    return any(hook is not None and bool(getattr(hook, "calls", True))
               for hook in (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook))


class Launch:
    """One kernel launch with fixed grid and non-tensor arguments; ``launch(*tensors)`` runs it on
    tensors that take, in order, the places the tensors of ``args`` / ``kwargs`` had."""

    __slots__ = ("kernel", "grid", "arguments", "options", "slots", "descriptors", "compiled", "direct", "scratch")

    def __init__(self, kernel, grid: Sequence[int], args: Sequence, kwargs: Dict,
                 descriptor_bases: Optional[Dict[str, str]] = None):
        names = kernel.arg_names
        values = dict(zip(names, args))
        values.update((name, value) for name, value in kwargs.items() if name in values or name in names)
        missing = [name for name in names if name not in values]
        if missing:
            raise TypeError(f"launch of {kernel.__name__}: no value for {missing}")
        self.kernel = kernel
        self.grid = tuple(grid) + (1,) * (3 - len(grid))
        self.arguments = [values[name] for name in names]
        # Launch options (num_warps, num_stages, ...) are not kernel parameters.
        self.options = {name: value for name, value in kwargs.items() if name not in names}
        self.slots = [i for i, value in enumerate(self.arguments) if isinstance(value, torch.Tensor)]
        # Host-built descriptors (host_descriptors.py), each over the tensor argument that
        # ``descriptor_bases`` names for it: each call rebuilds them over the tensor that takes
        # that argument's place. Named, not found by identity: a building call may pass one
        # tensor as several arguments (q, k and v alike) where later calls pass three.
        # (argument index, index into the call's tensors, template)
        bases = descriptor_bases or {}
        self.descriptors = [(i, self._tensor_index(names, bases.get(names[i])), value)
                            for i, value in enumerate(self.arguments) if is_host_descriptor(value)]
        self.compiled = None
        self.direct = None  # the device the compiled kernel was loaded on, once direct launches work
        # Whether the compiled kernel asks Triton for a global buffer (descriptors built on the
        # device): known after the first call, which runs where the plan was built and its
        # allocator set; later calls may come from other threads (descriptor_scratch).
        self.scratch = False
        # Tensors of the building call are not kept alive by the plan.
        for i in self.slots:
            self.arguments[i] = None
        for i, _, template in self.descriptors:
            self.arguments[i] = None
            template.base = None

    def _tensor_index(self, names: Sequence[str], base: Optional[str]) -> int:
        """Which of the call's tensors is argument ``base`` (a descriptor's tensor)."""
        index = names.index(base) if base in names else -1
        if index not in self.slots:
            raise TypeError(f"launch of {self.kernel.__name__}: a descriptor over {base!r}, not a tensor argument")
        return self.slots.index(index)

    def _rebuilt_if_degenerate(self, compiled, arguments):
        """``compiled``, or where ptxas built it with few registers and the rest in local memory
        (device_limits.built_degenerately) and the launcher set no register cap, the same kernel
        rebuilt (not run) with ``maxnreg`` MAX_REGISTERS, which this plan's later calls launch."""
        registers, local_words = getattr(compiled, "n_regs", None), getattr(compiled, "n_spills", None)
        if (registers is None or local_words is None or "maxnreg" in self.options
                or not built_degenerately(registers, 4 * local_words)):  # Triton counts 4-byte words
            return compiled
        self.options = dict(self.options, maxnreg=MAX_REGISTERS)
        return resolve(self.kernel).warmup(*arguments, grid=self.grid, **self.options)

    def __call__(self, *tensors: torch.Tensor) -> None:
        if len(tensors) != len(self.slots):
            raise TypeError(f"launch of {self.kernel.__name__}: {len(tensors)} tensors for {len(self.slots)} places")
        arguments = list(self.arguments)
        for i, t in zip(self.slots, tensors):
            arguments[i] = t
        for i, n, template in self.descriptors:
            arguments[i] = rebased(template, tensors[n])
        if self.scratch:
            ensure_allocator()
        if self.direct is not None and not _launch_hooks_installed():
            # Triton's own launch path, less the binder: the current device's stream, and the
            # device the kernel was loaded on (a kernel handle belongs to one device).
            device = driver.active.get_current_device()
            if device == self.direct:
                c = self.compiled
                c.run(self.grid[0], self.grid[1], self.grid[2], driver.active.get_current_stream(device), c.function,
                      c.packed_metadata, None, None, None, *arguments)
                return
        compiled = self._rebuilt_if_degenerate(resolve(self.kernel)[self.grid](*arguments, **self.options), arguments)
        self.scratch = getattr(getattr(compiled, "metadata", None), "global_scratch_size", 0) > 0
        if self.compiled is None and knobs is not None and not interpreting() and all(
                hasattr(compiled, name) for name in ("run", "function", "packed_metadata")):
            self.compiled = compiled
            self.direct = driver.active.get_current_device()
