"""On-disk autotune cache: which (backend, config) is fastest for a problem signature.

``HALOATTN_AUTOTUNE=1`` (or ``haloattn tune``) times the candidates once per signature (every one
screened, the close ones again in interleaved rounds) and stores the winner. One JSON file per
(device, capability, haloattn, torch, triton, driver versions) under ``HALOATTN_CACHE_DIR``
(default: the platform's user cache directory). Writes merge with what is on disk and replace the
file atomically under a file lock, so many processes sharing one file lose no entry; an
unreadable or mismatched file is ignored with a warning and rewritten.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
import warnings
from functools import lru_cache
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from .problem import Problem

AUTOTUNE_ENV = "HALOATTN_AUTOTUNE"
CACHE_DIR_ENV = "HALOATTN_CACHE_DIR"
FORMAT = 1

_lock = threading.Lock()
_memory: Dict[str, "TuningFile"] = {}


def autotune_enabled() -> bool:
    return os.environ.get(AUTOTUNE_ENV, "") not in ("", "0", "false", "False")


def cache_dir() -> str:
    configured = os.environ.get(CACHE_DIR_ENV)
    if configured:
        return configured
    try:
        import platformdirs

        return platformdirs.user_cache_dir("haloattn")
    except ImportError:  # platformdirs is a dependency; this only guards odd environments
        return os.path.join(os.path.expanduser("~"), ".cache", "haloattn")


def _driver_version() -> str:
    for name in ("libcuda.so.1", "libcuda.so", "nvcuda.dll"):
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        version = ctypes.c_int(0)
        if lib.cuDriverGetVersion(ctypes.byref(version)) == 0:
            return str(version.value)
    return "none"


@lru_cache(maxsize=None)
def device_metadata(device_type: str, index: int) -> Dict[str, str]:
    """What a tuning result depends on besides the problem: the file is keyed on all of it."""
    from . import __version__

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = "none"
    if device_type == "cuda":
        name = torch.cuda.get_device_name(index)
        capability = "%d.%d" % torch.cuda.get_device_capability(index)
        driver = _driver_version()
    else:
        name = f"{device_type}:{platform.machine()}:{platform.processor() or 'unknown'}"
        capability = "none"
        driver = "none"
    return {
        "format": str(FORMAT),
        "device": name,
        "capability": capability,
        "haloattn": __version__,
        "torch": torch.__version__,
        "triton": triton_version,
        "driver": driver,
    }


def cache_path(device: torch.device) -> str:
    meta = device_metadata(device.type, device.index if device.index is not None else 0)
    digest = hashlib.sha1(json.dumps(meta, sort_keys=True).encode()).hexdigest()[:16]
    slug = "".join(c if c.isalnum() else "-" for c in meta["device"]).strip("-")[:40]
    return os.path.join(cache_dir(), f"tuning-{slug}-{digest}.json")


def signature(problem: Problem, needs_grad: bool = False, forced: Optional[str] = None) -> str:
    """A stable text key for a problem (mods by qualified name: their code is not hashed).
    ``forced``: the key of a tuning run restricted to that backend (its configs only), kept apart
    from the unrestricted winner so forcing a backend never changes what unforced calls pick."""
    def name(fn):
        return None if fn is None else f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"

    fields = {
        "pattern": problem.pattern,
        "grid": problem.spatial,
        "axes": [[a.window, a.stride, a.dilation, int(a.causal), a.shift] for a in problem.axes],
        "B": problem.batch,
        "H": [problem.heads, problem.kv_heads],
        "D": [problem.head_dim, problem.value_dim],
        "dtype": str(problem.dtype).replace("torch.", ""),
        "rpb": problem.has_rpb,
        "softcap": problem.softcap is not None,
        "kq_conv": problem.kq_conv_shape,
        "extra": problem.extra_tokens,
        "mods": [name(problem.score_mod), name(problem.mask_mod)],
        "grad": needs_grad,
    }
    if forced is not None:
        fields["forced"] = forced
    return json.dumps(fields, sort_keys=True, separators=(",", ":"))


class TuningFile:
    """One cache file: its metadata and entries, read once and refreshed on every write."""

    def __init__(self, path: str, metadata: Dict[str, str]):
        self.path = path
        self.metadata = metadata
        self.write_error: Optional[str] = None  # why the last store() could not reach the disk
        self.entries: Dict[str, dict] = self._read()

    def _read(self) -> Dict[str, dict]:
        try:
            with open(self.path, encoding="utf-8") as f:
                data = json.load(f)
        except (FileNotFoundError, NotADirectoryError):  # nothing stored yet (store() says if it cannot write)
            return {}
        except (OSError, ValueError) as exc:
            warnings.warn(f"haloattn: ignoring unreadable tuning cache {self.path} ({exc}); it will be rewritten")
            return {}
        if not isinstance(data, dict) or data.get("_metadata") != self.metadata or not isinstance(data.get("entries"), dict):
            warnings.warn(
                f"haloattn: ignoring tuning cache {self.path}: it was written for another device or "
                "version (or is malformed); it will be rewritten"
            )
            return {}
        return valid_entries(data["entries"], self.path)

    def store(self, new_entries: Dict[str, dict]) -> None:
        """Merge ``new_entries`` with the file's current content and replace it atomically. A cache
        that cannot be written (a read-only directory, a file where the directory should be) only
        costs the results' reuse by other processes: warn, keep them in memory, and carry on."""
        try:
            self._store(new_entries)
            self.write_error = None
        except OSError as exc:
            self.write_error = f"{type(exc).__name__}: {exc}"
            self.entries = dict(self.entries, **new_entries)
            warnings.warn(
                f"haloattn: cannot write the tuning cache {self.path} ({self.write_error}); its results are "
                f"kept for this process only (set {CACHE_DIR_ENV} to a writable directory)"
            )

    def _store(self, new_entries: Dict[str, dict]) -> None:
        from filelock import FileLock

        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        with FileLock(self.path + ".lock"):
            merged = self._read()
            merged.update(new_entries)
            fd, tmp = tempfile.mkstemp(dir=os.path.dirname(self.path), prefix=".tuning-", suffix=".tmp")
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    json.dump({"_metadata": self.metadata, "entries": merged}, f, indent=1, sort_keys=True)
                os.replace(tmp, self.path)
            except BaseException:
                if os.path.exists(tmp):
                    os.unlink(tmp)
                raise
            self.entries = merged


def valid_entries(entries: dict, source: str) -> Dict[str, dict]:
    """The well-formed entries of a cache (``{"backend": str, "config": dict or None, ...}``); a
    malformed one (hand-edited, or from another release) is dropped with a warning, not handed to
    the dispatcher or a backend, where it would fail far from its cause."""
    valid = {}
    for key, entry in entries.items():
        if (isinstance(entry, dict) and isinstance(entry.get("backend"), str)
                and (entry.get("config") is None or isinstance(entry.get("config"), dict))):
            valid[key] = entry
        else:
            warnings.warn(f"haloattn: ignoring malformed tuning cache entry in {source}: {key!r}: {entry!r} "
                          '(expected {"backend": <name>, "config": <dict or null>, ...})')
    return valid


def tuning_file(device: torch.device) -> TuningFile:
    path = cache_path(device)
    with _lock:
        tf = _memory.get(path)
        if tf is None:
            meta = device_metadata(device.type, device.index if device.index is not None else 0)
            tf = _memory[path] = TuningFile(path, meta)
        return tf


def forget_loaded_files() -> None:
    """Drop in-memory copies so the next lookup re-reads disk (after import or in tests)."""
    with _lock:
        _memory.clear()


def cached_entry(problem: Problem, needs_grad: bool = False, forced: Optional[str] = None) -> Optional[dict]:
    return tuning_file(problem.device).entries.get(signature(problem, needs_grad, forced))


def cached_choice(
    problem: Problem, runnable: Sequence[str], needs_grad: Optional[bool] = None
) -> Optional[Tuple[str, Optional[dict]]]:
    """The stored winner, if it is still among the backends that can run the problem. The entry
    tuned with the same ``needs_grad`` comes first; the other one serves as a fallback."""
    order = (False, True) if needs_grad is None else (bool(needs_grad), not needs_grad)
    for needs_grad in order:
        entry = cached_entry(problem, needs_grad)
        if entry and entry.get("backend") in runnable:
            return entry["backend"], entry.get("config")
    return None


def tuned_entry(problem: Problem, backend_name: str, needs_grad: Optional[bool] = None,
                exact: bool = False) -> Optional[dict]:
    """The stored tuning result that gives ``backend_name``'s config for ``problem``: a run
    restricted to it (forced), else an unrestricted run it won; None if it was never tuned. The
    run tuned with the same ``needs_grad`` comes first, as in :func:`cached_choice`: a forward-only
    run never timed the backward's part of its configs. ``exact``: that run only."""
    if needs_grad is None:
        order = (False, True)
    else:
        order = (bool(needs_grad),) if exact else (bool(needs_grad), not needs_grad)
    for grad in order:
        for forced in (backend_name, None):
            entry = cached_entry(problem, grad, forced)
            if entry and entry.get("backend") == backend_name:
                return entry
    return None


def cached_config(problem: Problem, backend_name: str, needs_grad: Optional[bool] = None) -> Optional[dict]:
    """A config stored for ``backend_name`` (used when that backend is forced)."""
    entry = tuned_entry(problem, backend_name, needs_grad)
    return entry.get("config") if entry else None


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_call(fn, device: torch.device, warmup: int = 1, repeat: int = 5) -> float:
    """Median wall time of ``fn()`` in milliseconds, synchronising the device around each call."""
    for _ in range(warmup):
        fn()
    _synchronize(device)
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        _synchronize(device)
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples)


# How candidates are timed, and why in two phases. A few calls per candidate, taken right after
# that candidate compiled, are as noisy as the differences they rank: in one tuning run on an H200
# (2026-12-02, RESULTS.md "The tuner's own noise") three copies of one Triton config read 1.30, 1.36 and 1.54 ms.
# So one pass over every candidate only screens them; those within FINALIST_MARGIN of the screen's
# best (at most MAX_FINALISTS) and the first config of the best one's backend (its heuristic
# default, so that a tuned choice has to beat it on the same footing) are then timed again in
# ROUNDS interleaved rounds, every kernel compiled by then, the order rotated each round so that
# drift spreads over all of them, and ranked by their median over the rounds.
SCREEN_REPEAT = 3
FINALIST_MARGIN = 1.25
MAX_FINALISTS = 6
ROUNDS = 5


def _trial_label(backend, config) -> str:
    return backend.name if config is None else f"{backend.name} {json.dumps(config, sort_keys=True)}"


def _unique_trials(candidates, problem: Problem) -> List[Tuple[object, Optional[dict], str]]:
    """(backend, config, label) of every candidate, each distinct label once (a backend may offer
    the same config twice: timing it twice only adds noise to the ranking)."""
    trials, seen = [], set()
    for backend in candidates:
        for config in _offered_configs(backend, problem):
            label = _trial_label(backend, config)
            if label not in seen:
                seen.add(label)
                trials.append((backend, config, label))
    return trials


def _offered_configs(backend, problem: Problem) -> List[Optional[dict]]:
    """``backend.configs(problem)`` as the cache will hand the winner back: each None or a dict
    after a JSON round trip (tuples become lists), so that the tuned process runs what every later
    one reads. A plugin whose configs() raises or answers with no list is tuned on its default
    (None) alone, and a config that is not None or a JSON dict is skipped, each with a warning:
    they used to fail the tuning (under HALOATTN_AUTOTUNE=1, every call of every backend), and a
    str config was stored, then refused as a malformed entry by every later read; an empty list
    left the backend out of the tuning without a word."""
    try:
        offered = backend.configs(problem)
        if not isinstance(offered, (list, tuple)):
            raise TypeError(f"returned {offered!r}; it must return a list of configs (None or dicts)")
    except Exception as exc:
        warnings.warn(f"haloattn tuning: backend {backend.name!r}: configs() failed ({type(exc).__name__}: {exc}); "
                      "tuning its default (None) only")
        return [None]
    configs = []
    for config in offered:
        try:
            stored = None if config is None else json.loads(json.dumps(config))
        except (TypeError, ValueError):
            stored = ()
        if stored is not None and not isinstance(stored, dict):
            warnings.warn(f"haloattn tuning: backend {backend.name!r} offered config {config!r}, which is neither "
                          "None nor a dict of JSON values (the cache stores it as JSON); skipped")
            continue
        configs.append(stored)
    if not configs:
        warnings.warn(f"haloattn tuning: backend {backend.name!r} offered no usable config; tuning its default (None)")
        return [None]
    return configs


def _finalists(screened: Dict[str, float], defaults: Dict[str, str], backend_of: Dict[str, str]) -> List[str]:
    """The labels re-timed in rounds: the screen's closest candidates and the winner's backend
    default (``defaults``: backend name -> label of its first config)."""
    ranked = sorted(screened, key=screened.get)
    best = screened[ranked[0]]
    close = [label for label in ranked if screened[label] <= FINALIST_MARGIN * best][:MAX_FINALISTS]
    default = defaults.get(backend_of[ranked[0]])
    if default in screened and default not in close:
        close.append(default)
    return close


def _round_medians(finalists: List[str], steps: Dict[str, object], device: torch.device) -> Dict[str, float]:
    """Each finalist's median over ROUNDS interleaved rounds, the order rotated each round; a
    finalist that fails when re-timed is dropped with a warning."""
    samples: Dict[str, List[float]] = {label: [] for label in finalists}
    for r in range(ROUNDS):
        for label in finalists[r % len(finalists):] + finalists[:r % len(finalists)]:
            if label not in samples:
                continue
            try:
                samples[label].append(time_call(steps[label], device, repeat=SCREEN_REPEAT))
            except Exception as exc:  # ran in the screen, fails now (memory, say): out of the rounds
                warnings.warn(f"haloattn tuning: {label} failed when re-timed ({type(exc).__name__}: {exc}); dropped")
                del samples[label]
    return {label: statistics.median(times) for label, times in samples.items()}


def autotune(problem: Problem, candidates, inputs, needs_grad: bool, forced: Optional[str] = None):
    """Time every (backend, config) candidate on ``inputs`` (screened, then the close ones again in
    interleaved rounds); store and return the fastest. ``forced``: the candidates are that one
    forced backend; its result is stored apart (see :func:`signature`)."""
    from .backend import AttentionInputs, checked_gradients, checked_outputs, on_device

    trials = _unique_trials(candidates, problem)
    detached = AttentionInputs(*(t.detach() if t is not None else None for t in inputs))
    needs = [t is not None for t in detached]
    screened: Dict[str, float] = {}
    steps: Dict[str, Tuple[object, Optional[dict], object]] = {}
    defaults: Dict[str, str] = {}
    show_progress = len(trials) > 1 and sys.stderr.isatty()
    for n, (backend, config, label) in enumerate(trials, 1):
        defaults.setdefault(backend.name, label)
        if show_progress:
            bar = "#" * (20 * n // len(trials))
            print(f"\rhaloattn tuning [{bar:<20}] {n}/{len(trials)} {label[:50]:<50}", end="", file=sys.stderr, flush=True)

        checked = []

        def step(backend=backend, config=config, checked=checked):
            with on_device(problem.device):
                result = backend.forward(problem, detached, config)
                # the first (warm-up) call is checked: a candidate that breaks the contract fails
                out, lse = result if checked else checked_outputs(backend, detached, result)
                grads = None
                if needs_grad:
                    grads = backend.backward(problem, detached, out, lse, torch.ones_like(out), None, needs, config)
                if not checked:
                    if needs_grad:
                        checked_gradients(backend, detached, grads, needs)
                    checked.append(True)

        try:
            screened[label] = time_call(step, problem.device, repeat=SCREEN_REPEAT)
        except Exception as exc:  # a candidate that fails is skipped, and says why
            warnings.warn(f"haloattn tuning: {label} failed ({type(exc).__name__}: {exc}); skipped")
            continue
        steps[label] = (backend, config, step)
    if show_progress:
        print(file=sys.stderr)
    if not screened:
        raise RuntimeError(f"haloattn tuning: every candidate failed for {problem.describe()}")

    finalists = _finalists(screened, defaults, {label: steps[label][0].name for label in steps})
    final = {label: screened[label] for label in finalists}
    if len(finalists) > 1:
        final = _round_medians(finalists, {label: steps[label][2] for label in finalists}, problem.device) or final
    winner = min(final, key=final.get)
    backend, config, _ = steps[winner]
    entry = {"backend": backend.name, "config": config, "ms": round(final[winner], 6), "candidates_ms": screened,
             "finalists_ms": {label: round(ms, 6) for label, ms in final.items()},
             "defaults": {name: label for name, label in defaults.items() if label in screened}}
    tuning_file(problem.device).store({signature(problem, needs_grad, forced): entry})
    return backend, config


def export_cache(device: torch.device, destination: str) -> int:
    """Copy this device's cache file to ``destination``; returns the number of entries."""
    tf = tuning_file(device)
    tf.entries = tf._read()
    with open(destination, "w", encoding="utf-8") as f:
        json.dump({"_metadata": tf.metadata, "entries": tf.entries}, f, indent=1, sort_keys=True)
    return len(tf.entries)


def import_cache(device: torch.device, source: str) -> int:
    """Merge the entries of an exported file into this device's cache (same metadata only).
    Raises ValueError naming the file when it cannot be read or is no exported cache."""
    try:
        with open(source, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot import {source!r}: {exc}") from None
    tf = tuning_file(device)
    if not isinstance(data, dict) or not isinstance(data.get("entries"), dict):
        raise ValueError(f"cannot import {source!r}: it is not an exported tuning cache "
                         '(expected {"_metadata": {...}, "entries": {...}}, as haloattn tune --export writes)')
    if data.get("_metadata") != tf.metadata:
        raise ValueError(
            f"{source} was tuned for {data.get('_metadata')}; "
            f"this machine is {tf.metadata}: import refuses results from another device or version"
        )
    entries = valid_entries(data["entries"], source)
    tf.store(entries)
    if tf.write_error:
        raise ValueError(f"cannot import {source!r} into {tf.path}: {tf.write_error}")
    return len(entries)
