"""Choosing a backend for a Problem: plugin loading, forcing, tuning, priority and explanations.

Order of choice: the ``backend=`` argument; ``HALOATTN_BACKEND`` (a name, or a comma list in
priority order); the tuning cache; the highest-priority backend that supports the problem. A
forced backend that cannot run raises with its reasons: nothing ever falls back silently.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import threading
import warnings
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from . import tuning
from .backend import Backend, Config
from .hookspecs import ENTRY_POINT_GROUP, PROJECT, BackendSpecs
from .problem import Problem

log = logging.getLogger("haloattn")

BACKEND_ENV = "HALOATTN_BACKEND"
DISABLED_ENV = "HALOATTN_DISABLED_PLUGINS"


class BackendUnavailableError(RuntimeError):
    """No backend (or no forced backend) can run the problem; the message lists every reason."""


class SlowPathWarning(UserWarning):
    """An accelerator problem went to the pure-PyTorch reference backend because every faster
    backend installed for that device declined it (the message says why)."""


class Registry:
    """Holds the backends; plugins receive it in ``haloattn_register_backends``."""

    def __init__(self):
        self.backends: Dict[str, Backend] = {}

    def add(self, backend: Backend) -> None:
        if isinstance(backend, type) and issubclass(backend, Backend):
            raise TypeError(f"registry.add expects a haloattn.Backend instance, got the class {backend.__name__}; "
                            f"pass {backend.__name__}()")
        if not isinstance(backend, Backend):
            raise TypeError(f"registry.add expects a haloattn.Backend instance, got {type(backend).__name__}")
        name, kind = backend.name, type(backend).__name__
        # A name is what backend= and HALOATTN_BACKEND (a comma list, stripped) select by, so one
        # with a comma or a space could never be forced; "unnamed" is Backend's own placeholder.
        if not isinstance(name, str) or not name or name == Backend.name:
            raise ValueError(f"backend {kind} has name={name!r}; set its class attribute name to a non-empty str")
        if "," in name or name != "".join(name.split()):
            raise ValueError(f"backend {kind} has name={name!r}; names may not contain commas or whitespace")
        # priorities are sorted against the built-ins' ints: a str would break every later dispatch
        if isinstance(backend.priority, bool) or not isinstance(backend.priority, int):
            raise TypeError(f"backend {name!r} has priority={backend.priority!r}; it must be an int")
        if name in self.backends and self.backends[name] is not backend:
            raise ValueError(f"a backend named {name!r} is already registered ({self.backends[name]!r})")
        self.backends[backend.name] = backend


@dataclass
class Verdict:
    name: str
    priority: int
    reasons: List[str]

    @property
    def can_run(self) -> bool:
        return not self.reasons


@dataclass
class Explanation:
    """Every backend's verdict for a problem, and the one that would run."""

    problem: Problem
    verdicts: List[Verdict]
    chosen: Optional[str]
    config: Config = None
    why: str = ""
    plugin_errors: Dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        lines = [f"problem: {self.problem.describe()}"]
        width = max([12, *(len(v.name) for v in self.verdicts)])  # triton_window and plugins' longer names
        for v in self.verdicts:
            mark = "->" if v.name == self.chosen else ("ok" if v.can_run else "no")
            detail = "can run" if v.can_run else "; ".join(v.reasons)
            lines.append(f"  {mark} {v.name:<{width}} priority {v.priority:>4}  {detail}")
        for name, err in self.plugin_errors.items():
            lines.append(f"  !! plugin {name!r} failed to load: {err}")
        if self.chosen:
            cfg = f" config {self.config}" if self.config else ""
            lines.append(f"would run: {self.chosen}{cfg} ({self.why})")
        else:
            lines.append(f"would run: nothing ({self.why})")
        return "\n".join(lines)


class Dispatcher:
    def __init__(self):
        self.registry = Registry()
        self.plugin_errors: Dict[str, str] = {}
        self._loaded = False
        self._lock = threading.RLock()
        self._decisions: Dict[tuple, Tuple[Backend, Config]] = {}
        self._logged: set = set()

    # -- plugins -------------------------------------------------------------------------------
    def _load_plugins(self) -> None:
        import pluggy

        manager = pluggy.PluginManager(PROJECT)
        manager.add_hookspecs(BackendSpecs)
        disabled = {n.strip() for n in os.environ.get(DISABLED_ENV, "").split(",") if n.strip()}
        # haloattn's own backends load first, and hooks run in load order (pluggy's own order is
        # the reverse): a third-party plugin whose entry point or backend reuses a built-in's name
        # then fails to register, instead of displacing the built-in (the reference backend is the
        # oracle and the fallback), whatever order sys.path lists the distributions in.
        def builtin_first(ep):
            return getattr(getattr(ep, "dist", None), "name", None) != PROJECT

        loaded: Dict[str, str] = {}
        for ep in sorted(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP), key=builtin_first):
            if ep.name in disabled:
                continue
            if ep.name in loaded:
                if loaded[ep.name] != ep.value:  # the same entry point seen twice on sys.path is no error
                    error = f"entry point name {ep.name!r} is already taken by {loaded[ep.name]}"
                    self.plugin_errors[f"{ep.name} ({ep.value})"] = error
                    log.warning("haloattn: skipping backend plugin %r (%s): %s", ep.name, ep.value, error)
                continue
            try:
                plugin = ep.load()
                manager.register(plugin, name=ep.name)
                loaded[ep.name] = ep.value
            except Exception as exc:  # a broken plugin must never break the host
                self.plugin_errors[ep.name] = f"{type(exc).__name__}: {exc}"
                log.warning("haloattn: skipping backend plugin %r (%s): %s", ep.name, ep.value, exc)
        order = list(loaded)
        impls = manager.hook.haloattn_register_backends.get_hookimpls()
        for impl in sorted(impls, key=lambda i: order.index(i.plugin_name) if i.plugin_name in order else len(order)):
            try:
                impl.function(registry=self.registry)
            except Exception as exc:
                self.plugin_errors[impl.plugin_name] = f"{type(exc).__name__}: {exc}"
                log.warning("haloattn: backend plugin %r failed to register: %s", impl.plugin_name, exc)

    def ensure_loaded(self) -> None:
        if not self._loaded:
            with self._lock:
                if not self._loaded:
                    self._load_plugins()
                    self._loaded = True

    def register(self, backend: Backend) -> None:
        self.ensure_loaded()
        with self._lock:
            self.registry.add(backend)
            self._decisions.clear()

    def backends(self) -> List[Backend]:
        self.ensure_loaded()
        return sorted(self.registry.backends.values(), key=lambda b: (-b.priority, b.name))

    def get(self, name: str) -> Backend:
        self.ensure_loaded()
        try:
            return self.registry.backends[name]
        except KeyError:
            known = ", ".join(sorted(self.registry.backends)) or "none"
            # a plugin of that name that failed to load is the likelier story than a typo
            failed = f" (plugin {name!r} failed to load: {self.plugin_errors[name]})" if name in self.plugin_errors else ""
            raise ValueError(f"backend={name!r} does not exist{failed}; installed backends: {known}") from None

    # -- choice --------------------------------------------------------------------------------
    def verdict(self, backend: Backend, problem: Problem, needs_jvp: bool = False) -> Verdict:
        """Whether ``backend`` can run ``problem`` (and, with ``needs_jvp``, its forward-mode rule
        too: a call carrying tangents), with every reason it cannot."""
        reasons = self.unavailable_reasons(backend)
        if not reasons:
            reasons = _asked(backend.not_supported_reasons, problem)
        if not reasons and needs_jvp:
            reasons = [f"forward-mode AD: {r}" for r in _asked(backend.jvp_not_supported_reasons, problem)]
        return Verdict(backend.name, backend.priority, reasons)

    def unavailable_reasons(self, backend: Backend) -> List[str]:
        """``backend.available()``, guarded: a plugin whose check raises or returns no list of
        strings cannot run anything, and says so, rather than breaking every dispatch."""
        return _asked(backend.available)

    def _forced(self, forced: Optional[str]) -> Optional[Tuple[str, Tuple[str, ...]]]:
        if forced is not None:
            source, value = "backend=", forced
        else:
            value = os.environ.get(BACKEND_ENV)
            source = BACKEND_ENV
            if not value:
                return None
        if not isinstance(value, str):
            raise TypeError(f"backend={value!r}; expected a backend name or a comma list of names")
        names = tuple(n.strip() for n in value.split(",") if n.strip())
        if not names:
            raise ValueError(f"{source}={value!r} names no backend")
        for n in names:
            try:
                self.get(n)
            except ValueError as err:
                if source == BACKEND_ENV:  # name the variable, not an argument the caller never passed
                    raise ValueError(f"{BACKEND_ENV}={value!r}: {err}") from None
                raise
        return source, names

    def check_forced(self, forced: Optional[str]) -> None:
        """Raise as a call would for a bad ``backend=`` argument or ``HALOATTN_BACKEND`` (wrong
        type, unknown names); for calls that validate without dispatching (the custom op's fake,
        on meta tensors and while torch.compile traces)."""
        self._forced(forced)

    def explain(
        self, problem: Problem, forced: Optional[str] = None, autotune: bool = False, needs_grad: Optional[bool] = None,
        needs_jvp: bool = False,
    ) -> Explanation:
        self.ensure_loaded()
        verdicts = [self.verdict(b, problem, needs_jvp) for b in self.backends()]
        by_name = {v.name: v for v in verdicts}
        force = self._forced(forced)
        if force is not None:
            source, names = force
            for n in names:
                if by_name[n].can_run:
                    config = tuning.cached_config(problem, n, needs_grad)
                    return Explanation(problem, verdicts, n, config, f"forced by {source}", dict(self.plugin_errors))
            return Explanation(problem, verdicts, None, None, f"forced by {source} to {', '.join(names)}, which cannot run it", dict(self.plugin_errors))
        runnable = [v.name for v in verdicts if v.can_run]
        if not runnable:
            return Explanation(problem, verdicts, None, None, "no installed backend supports it", dict(self.plugin_errors))
        winner = tuning.cached_choice(problem, runnable, needs_grad)
        if winner is not None:
            return Explanation(problem, verdicts, winner[0], winner[1], "tuning cache", dict(self.plugin_errors))
        return Explanation(problem, verdicts, runnable[0], None, "highest priority that supports it", dict(self.plugin_errors))

    def select(
        self, problem: Problem, forced: Optional[str], inputs=None, needs_grad: bool = False, needs_jvp: bool = False
    ) -> Tuple[Backend, Config]:
        """The backend (and config) to run ``problem``, decided once per signature. ``needs_jvp``:
        the call carries tangents, so only backends with a forward-mode rule for it qualify."""
        if forced is not None and not isinstance(forced, str):
            self._forced(forced)  # raises naming it, before it is hashed into a key (a list is not hashable)
        env = os.environ.get(BACKEND_ENV)
        autotune = tuning.autotune_enabled() and not needs_jvp  # tuning times forwards and backwards only
        key = (problem, forced, env, autotune, needs_grad, needs_jvp)
        decision = self._decisions.get(key)
        if decision is not None:
            return decision
        with self._lock:
            decision = self._decide(problem, forced, inputs, needs_grad, autotune, needs_jvp)
            self._decisions[key] = decision
        return decision

    def _decide(self, problem, forced, inputs, needs_grad, autotune, needs_jvp=False) -> Tuple[Backend, Config]:
        explanation = self.explain(problem, forced, needs_grad=needs_grad, needs_jvp=needs_jvp)
        if explanation.chosen is None:
            raise BackendUnavailableError(
                f"haloattn cannot run this problem: {explanation.why}.\n{explanation}"
            )
        chosen = self.get(explanation.chosen)
        config = explanation.config
        # tune unless this exact signature (gradients included) is on disk already
        tuned = explanation.why == "tuning cache" and tuning.cached_entry(problem, needs_grad) is not None
        if autotune and inputs is not None and not tuned:
            if explanation.why.startswith("forced"):
                # tune the forced backend's configs once per signature, gradients included (stored
                # apart from the unforced winner)
                if tuning.tuned_entry(problem, chosen.name, needs_grad, exact=True) is None:
                    chosen, config = tuning.autotune(problem, [chosen], inputs, needs_grad, forced=chosen.name)
            else:
                candidates = [self.get(v.name) for v in explanation.verdicts if v.can_run]
                chosen, config = tuning.autotune(problem, candidates, inputs, needs_grad)
        if not explanation.why.startswith("forced"):
            self._warn_if_slow_path(problem, chosen, explanation)
        if log.isEnabledFor(logging.DEBUG) or os.environ.get("HALOATTN_LOG", "").lower() == "debug":
            signature = (problem, chosen.name)
            if signature not in self._logged:
                self._logged.add(signature)
                _debug_logger().debug(
                    "haloattn: %s -> backend %r%s (%s)",
                    problem.describe(), chosen.name, f" config {config}" if config else "", explanation.why,
                )
        return chosen, config

    def _warn_if_slow_path(self, problem: Problem, chosen: Backend, explanation: Explanation) -> None:
        """A GPU problem that lands on the reference backend runs orders of magnitude slower than
        users expect: say so once per problem, with the reasons of the fast backends that declined.
        On the CPU the reference is the right choice and stays quiet; ``backend="reference"``
        (a deliberate choice) never warns."""
        if chosen.name != "reference" or problem.device.type == "cpu":
            return
        declined = [
            f"{v.name}: {'; '.join(v.reasons)}"
            for v in explanation.verdicts
            if v.name != chosen.name and v.reasons and not self.unavailable_reasons(self.get(v.name))
        ]
        if declined:
            warnings.warn(
                f"haloattn: {problem.describe()} runs on the pure-PyTorch reference backend (slow) on "
                f"{problem.device}, because " + " | ".join(declined)
                + ". Pass backend='reference' to make this choice explicit, or change the call.",
                SlowPathWarning,
                stacklevel=5,  # the caller of haloattn.attention()
            )

    def clear_decisions(self) -> None:
        with self._lock:
            self._decisions.clear()
            self._logged.clear()


def _asked(method, *args) -> List[str]:
    """A backend's reasons; a plugin whose check itself fails, or answers with anything but a list
    of strings (a bare str would read as one reason per character, None as "can run"), cannot
    run the problem either."""
    try:
        reasons = method(*args)
    except Exception as exc:
        return [f"{method.__name__} raised {type(exc).__name__}: {exc}"]
    if not isinstance(reasons, (list, tuple)) or not all(isinstance(r, str) for r in reasons):
        return [f"{method.__name__} returned {reasons!r}; it must return a list of str (empty: can run)"]
    return list(reasons)


def _debug_logger() -> logging.Logger:
    """HALOATTN_LOG=debug turns on haloattn's debug log even when the application set none up."""
    if os.environ.get("HALOATTN_LOG", "").lower() == "debug" and not log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.DEBUG)
    return log


DISPATCHER = Dispatcher()
