"""The on-disk autotune cache: corruption, version mismatch, 8 concurrent writers,
HALOATTN_AUTOTUNE=1 end to end (the next process reads the winner from disk), export/import."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import textwrap
import time
import warnings

import pytest
import torch

import haloattn
from haloattn import tuning
from haloattn.backend import AttentionInputs
from haloattn.dispatch import DISPATCHER
from haloattn.problem import build_problem

CPU = torch.device("cpu")


pytestmark = pytest.mark.usefixtures("plain_cpu_environment")


def _problem(L=8, dtype=torch.float32):
    q = torch.randn(1, L, 2, 4, dtype=dtype)
    return build_problem(q, q, q, 3)


def _read(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def test_cache_file_is_per_device_metadata(cache_dir):
    path = tuning.cache_path(CPU)
    assert os.path.dirname(path) == str(cache_dir)
    meta = tuning.device_metadata("cpu", 0)
    assert {"device", "capability", "haloattn", "torch", "triton", "driver", "format"} <= set(meta)
    assert meta["torch"] == torch.__version__ and meta["haloattn"] == haloattn.__version__
    tuning.tuning_file(CPU).store({"sig": {"backend": "reference", "config": None}})
    data = _read(path)
    assert data["_metadata"] == meta and data["entries"]["sig"]["backend"] == "reference"
    # any metadata change gives another file name
    tuning.device_metadata.cache_clear()
    try:
        original = tuning.device_metadata

        def other(device_type, index):
            return dict(original(device_type, index), torch="0.0.0")

        tuning.device_metadata = other
        assert tuning.cache_path(CPU) != path
    finally:
        tuning.device_metadata = original


def test_corrupt_file_is_ignored_with_warning_and_rewritten(cache_dir):
    path = tuning.cache_path(CPU)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write('{"_metadata": {"format": "1"}, "entries": {"x": ')  # truncated JSON
    with pytest.warns(UserWarning, match="unreadable tuning cache"):
        tf = tuning.TuningFile(path, tuning.device_metadata("cpu", 0))
    assert tf.entries == {}
    problem = _problem()
    with pytest.warns(UserWarning, match="unreadable tuning cache"):
        assert tuning.cached_entry(problem) is None  # lookups survive it
    with pytest.warns(UserWarning):
        tf.store({"a": {"backend": "reference", "config": None}})
    data = _read(path)  # now valid and ours
    assert data["_metadata"] == tuning.device_metadata("cpu", 0) and set(data["entries"]) == {"a"}
    # and reading it again is silent
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert tuning.TuningFile(path, tuning.device_metadata("cpu", 0)).entries == data["entries"]


@pytest.mark.parametrize("content", [
    {"_metadata": {"format": "1", "torch": "1.0"}, "entries": {"old": {"backend": "x"}}},
    {"entries": {"old": {"backend": "x"}}},
    ["not", "a", "dict"],
    "META_OK_ENTRIES_BAD",
])
def test_mismatched_or_malformed_file_is_ignored_and_rewritten(cache_dir, content):
    path = tuning.cache_path(CPU)
    meta = tuning.device_metadata("cpu", 0)
    if content == "META_OK_ENTRIES_BAD":
        content = {"_metadata": meta, "entries": ["old"]}
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(content, f)
    with pytest.warns(UserWarning, match="another device or version"):
        tf = tuning.TuningFile(path, meta)
    assert tf.entries == {}
    with pytest.warns(UserWarning, match="another device or version"):
        tf.store({"new": {"backend": "reference", "config": None}})
    data = _read(path)
    assert data["_metadata"] == meta and set(data["entries"]) == {"new"}


def _writer(path, meta, worker, per_worker, barrier):
    from haloattn import tuning as t

    barrier.wait()
    tf = t.TuningFile(path, meta)
    for i in range(per_worker):
        tf.store({f"w{worker}-e{i}": {"backend": "reference", "config": {"worker": worker, "i": i}}})


def test_eight_concurrent_writers_lose_no_entry(cache_dir):
    path = tuning.cache_path(CPU)
    meta = tuning.device_metadata("cpu", 0)
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(8)
    per_worker = 15
    procs = [ctx.Process(target=_writer, args=(path, meta, w, per_worker, barrier)) for w in range(8)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    data = _read(path)
    expected = {f"w{w}-e{i}" for w in range(8) for i in range(per_worker)}
    assert set(data["entries"]) == expected
    assert data["entries"]["w3-e7"]["config"] == {"worker": 3, "i": 7}
    leftovers = [n for n in os.listdir(os.path.dirname(path)) if n.endswith(".tmp")]
    assert leftovers == []


# ---------------------------------------------------------------------------------------------
# HALOATTN_AUTOTUNE=1 end to end

SLOW_BACKEND = '''
import time
import haloattn
from haloattn.dispatch import DISPATCHER

class SlowBackend(haloattn.Backend):
    """Priority above the reference but 30 ms slower per call: tuning must prefer the reference."""
    name = "test_slow"
    priority = 5000
    calls = 0

    def not_supported_reasons(self, problem):
        return []

    def configs(self, problem):
        return [{"delay_ms": 30}, {"delay_ms": 60}]

    def forward(self, problem, inputs, config=None):
        type(self).calls += 1
        time.sleep((config or {"delay_ms": 30})["delay_ms"] / 1e3)
        return DISPATCHER.get("reference").forward(problem, inputs)

    def backward(self, problem, inputs, out, lse, grad_out, grad_lse, needs_grad, config=None):
        time.sleep((config or {"delay_ms": 30})["delay_ms"] / 1e3)
        return DISPATCHER.get("reference").backward(problem, inputs, out, lse, grad_out, grad_lse, needs_grad)
'''
_namespace: dict = {}
exec(compile(SLOW_BACKEND, "<slow backend>", "exec"), _namespace)
SlowBackend = _namespace["SlowBackend"]


@pytest.fixture
def slow_backend(cache_dir):
    haloattn.register_backend(SlowBackend())
    yield SlowBackend
    DISPATCHER.registry.backends.pop("test_slow", None)
    haloattn.clear_caches()


def test_autotune_end_to_end(slow_backend, cache_dir, monkeypatch):
    q, k, v = (torch.randn(1, 10, 2, 4) for _ in range(3))
    # without tuning: the highest priority runs
    assert haloattn.explain(q, k, v, 3, verbose=False).chosen == "test_slow"
    monkeypatch.setenv("HALOATTN_AUTOTUNE", "1")
    calls = slow_backend.calls
    out = haloattn.attention(q, k, v, 3)
    timed = slow_backend.calls - calls
    assert timed >= 2  # both configs of the slow backend were timed
    assert torch.equal(out, haloattn.attention(q, k, v, 3, backend="reference"))
    data = _read(tuning.cache_path(CPU))
    assert len(data["entries"]) == 1
    (sig, entry), = data["entries"].items()
    assert entry["backend"] == "reference"
    assert set(entry["candidates_ms"]) == {"reference", 'test_slow {"delay_ms": 30}', 'test_slow {"delay_ms": 60}'}
    assert json.loads(sig)["grid"] == [10] and json.loads(sig)["grad"] is False
    # a repeated call (even after forgetting in-memory decisions) does not time again
    haloattn.clear_caches()
    calls = slow_backend.calls
    haloattn.attention(q, k, v, 3)
    assert slow_backend.calls == calls
    assert haloattn.explain(q, k, v, 3, verbose=False).why == "tuning cache"
    # a problem needing gradients is tuned separately, forward + backward
    qg = q.clone().requires_grad_()
    haloattn.attention(qg, k, v, 3).sum().backward()
    data = _read(tuning.cache_path(CPU))
    assert len(data["entries"]) == 2
    assert any(json.loads(s)["grad"] for s in data["entries"])

    # the next process (tuning off) reads the winner from disk
    monkeypatch.delenv("HALOATTN_AUTOTUNE")
    script = SLOW_BACKEND + textwrap.dedent("""
        import json, torch
        haloattn.register_backend(SlowBackend())
        q = torch.randn(1, 10, 2, 4)
        e = haloattn.explain(q, q, q, 3, verbose=False)
        other = haloattn.explain(torch.randn(1, 11, 2, 4), torch.randn(1, 11, 2, 4), torch.randn(1, 11, 2, 4), 3, verbose=False)
        haloattn.attention(q, q, q, 3)
        print("RESULT=" + json.dumps([e.chosen, e.why, other.chosen, other.why, SlowBackend.calls]))
    """)
    env = dict(os.environ, HALOATTN_CACHE_DIR=str(cache_dir), HALOATTN_DISABLED_PLUGINS="")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT=")][-1]
    chosen, why, other_chosen, other_why, slow_calls = json.loads(line[7:])
    assert (chosen, why) == ("reference", "tuning cache")
    assert other_chosen == "test_slow" and "highest priority" in other_why  # untuned shape
    assert slow_calls == 0


def test_autotune_forced_backend_tunes_its_configs_only(slow_backend, cache_dir, monkeypatch):
    """Forcing a backend under HALOATTN_AUTOTUNE=1 tunes that backend's configs once, stores the
    result apart from the unforced winner (forcing never changes what unforced calls pick) and
    does not re-time on later forced calls."""
    monkeypatch.setenv("HALOATTN_AUTOTUNE", "1")
    q = torch.randn(1, 9, 2, 4)
    haloattn.attention(q, q, q, 3, backend="test_slow")
    entries = _read(tuning.cache_path(CPU))["entries"]
    (sig, entry), = entries.items()
    assert json.loads(sig)["forced"] == "test_slow"
    assert entry["backend"] == "test_slow" and entry["config"] == {"delay_ms": 30}
    assert set(entry["candidates_ms"]) == {'test_slow {"delay_ms": 30}', 'test_slow {"delay_ms": 60}'}
    # an unforced call tunes every backend and picks the fast one
    haloattn.attention(q, q, q, 3)
    entries = _read(tuning.cache_path(CPU))["entries"]
    assert len(entries) == 2
    unforced = [e for s, e in entries.items() if "forced" not in json.loads(s)]
    assert unforced[0]["backend"] == "reference"
    # forcing again (fresh decisions, fresh in-memory files) reads its config back without timing
    haloattn.clear_caches()
    tuning.forget_loaded_files()
    calls = slow_backend.calls
    haloattn.attention(q, q, q, 3, backend="test_slow")
    assert slow_backend.calls == calls + 1  # just the call itself
    assert len(_read(tuning.cache_path(CPU))["entries"]) == 2
    e = haloattn.explain(q, q, q, 3, backend="test_slow", verbose=False)
    assert e.chosen == "test_slow" and e.config == {"delay_ms": 30}
    monkeypatch.delenv("HALOATTN_AUTOTUNE")
    haloattn.clear_caches()
    e = haloattn.explain(q, q, q, 3, verbose=False)
    assert (e.chosen, e.why) == ("reference", "tuning cache")


def test_forced_backend_tunes_gradients_apart_from_the_forward(slow_backend, cache_dir, monkeypatch):
    """A forward-only tuning of a forced backend never timed its configs' backward: a call that
    needs gradients tunes again, and each kind of call reads back the entry tuned for it."""
    monkeypatch.setenv("HALOATTN_AUTOTUNE", "1")
    q = torch.randn(1, 11, 2, 4)
    haloattn.attention(q, q, q, 3, backend="test_slow")
    qg = q.clone().requires_grad_()
    haloattn.attention(qg, q, q, 3, backend="test_slow").sum().backward()
    entries = [json.loads(s) for s in _read(tuning.cache_path(CPU))["entries"]]
    assert sorted((e["forced"], e["grad"]) for e in entries) == [("test_slow", False), ("test_slow", True)]
    # each kind of call reads its own entry (stored by hand, so that the two differ)
    problem = build_problem(q, q, q, 3)
    tuning.tuning_file(CPU).store({
        tuning.signature(problem, False, "test_slow"): {"backend": "test_slow", "config": {"delay_ms": 60}},
        tuning.signature(problem, True, "test_slow"): {"backend": "test_slow", "config": {"delay_ms": 30}},
    })
    haloattn.clear_caches()
    assert DISPATCHER.explain(problem, "test_slow", needs_grad=False).config == {"delay_ms": 60}
    assert DISPATCHER.explain(problem, "test_slow", needs_grad=True).config == {"delay_ms": 30}


def test_stale_cache_entry_for_a_backend_that_cannot_run_is_ignored(cache_dir):
    problem = _problem(L=12)
    tuning.tuning_file(CPU).store({tuning.signature(problem): {"backend": "no_such_backend", "config": None}})
    q = torch.randn(1, 12, 2, 4)
    e = haloattn.explain(q, q, q, 3, verbose=False)
    assert e.chosen == "reference" and e.why != "tuning cache"


def test_export_import(cache_dir, tmp_path, monkeypatch):
    tuning.tuning_file(CPU).store({"s1": {"backend": "reference", "config": None}, "s2": {"backend": "reference", "config": {"x": 1}}})
    exported = tmp_path / "export.json"
    assert tuning.export_cache(CPU, str(exported)) == 2
    # another machine (another cache directory) imports and merges
    monkeypatch.setenv("HALOATTN_CACHE_DIR", str(tmp_path / "other"))
    tuning.forget_loaded_files()
    tuning.tuning_file(CPU).store({"s3": {"backend": "reference", "config": None}})
    assert tuning.import_cache(CPU, str(exported)) == 2
    data = _read(tuning.cache_path(CPU))
    assert set(data["entries"]) == {"s1", "s2", "s3"} and data["entries"]["s2"]["config"] == {"x": 1}
    # an export from another device/version is refused
    foreign = json.loads(exported.read_text())
    foreign["_metadata"]["device"] = "some other machine"
    bad = tmp_path / "foreign.json"
    bad.write_text(json.dumps(foreign))
    with pytest.raises(ValueError, match="another device or version"):
        tuning.import_cache(CPU, str(bad))
    assert set(_read(tuning.cache_path(CPU))["entries"]) == {"s1", "s2", "s3"}


def test_signature_distinguishes_problems():
    base = _problem(8)
    assert tuning.signature(base) == tuning.signature(_problem(8))
    assert tuning.signature(base) != tuning.signature(_problem(9))
    assert tuning.signature(base) != tuning.signature(_problem(8, torch.float64))
    assert tuning.signature(base) != tuning.signature(base, needs_grad=True)


class ScriptedBackend(haloattn.Backend):
    """Configs whose timings a test scripts: ``times[id]`` is the list of what successive timings
    of config ``id`` read (the last value repeats; an exception is raised). Computes the
    reference's output."""

    name = "test_scripted"

    def __init__(self, configs, times):
        self._configs, self.times, self.timed = configs, times, []

    def not_supported_reasons(self, problem):
        return []

    def configs(self, problem):
        return self._configs

    def forward(self, problem, inputs, config=None):
        self.last = config["id"]
        return DISPATCHER.get("reference").forward(problem, inputs)


@pytest.fixture
def scripted(cache_dir, monkeypatch):
    """Makes a ScriptedBackend (passed to autotune directly, never registered) and a time_call
    that runs the step once and reads the script."""

    def install(configs, times):
        backend = ScriptedBackend(configs, times)

        def fake_time_call(fn, device, warmup=1, repeat=5):
            fn()
            backend.timed.append(backend.last)
            readings = backend.times[backend.last]
            reading = readings[min(backend.timed.count(backend.last), len(readings)) - 1]
            if isinstance(reading, Exception):
                raise reading
            return reading

        monkeypatch.setattr(tuning, "time_call", fake_time_call)
        return backend

    return install


def test_close_candidates_are_re_timed_in_interleaved_rounds(scripted):
    """A candidate that reads fast once (the screen, right after it compiled) does not win over
    one that is faster on the rounds' median; the rounds rotate their order, re-time the default
    even where it screened far behind, and leave the far candidates alone."""
    backend = scripted(
        [{"id": "default"}, {"id": "lucky"}, {"id": "steady"}, {"id": "slow"}],
        {"default": [1.5, 1.2], "lucky": [0.90, 1.15], "steady": [1.0], "slow": [3.0]})
    problem = _problem(L=13)
    chosen, config = tuning.autotune(problem, [backend], AttentionInputs(*(torch.randn(1, 13, 2, 4),) * 3), False)
    assert (chosen.name, config) == ("test_scripted", {"id": "steady"})
    screen, rounds = backend.timed[:4], backend.timed[4:]
    assert screen == ["default", "lucky", "steady", "slow"]
    # lucky and steady are within FINALIST_MARGIN of the screen's best; default is the backend's
    # first config; slow is neither.
    assert sorted(set(rounds)) == ["default", "lucky", "steady"]
    assert len(rounds) == 3 * tuning.ROUNDS
    firsts = [rounds[3 * r] for r in range(tuning.ROUNDS)]
    assert len(set(firsts)) == 3  # each round starts with another finalist
    entry = tuning.cached_entry(problem)
    assert entry["config"] == {"id": "steady"} and entry["ms"] == 1.0
    assert set(entry["finalists_ms"]) == {f'test_scripted {{"id": "{name}"}}' for name in ("default", "lucky", "steady")}
    assert len(entry["candidates_ms"]) == 4
    assert entry["defaults"] == {"test_scripted": 'test_scripted {"id": "default"}'}


def test_a_config_offered_twice_is_timed_once(scripted):
    backend = scripted([{"id": "a"}, {"id": "b"}, {"id": "a"}], {"a": [1.0], "b": [2.0]})
    problem = _problem(L=14)
    tuning.autotune(problem, [backend], AttentionInputs(*(torch.randn(1, 14, 2, 4),) * 3), False)
    assert backend.timed == ["a", "b"]  # screened once each; a alone is close, and the default
    assert list(tuning.cached_entry(problem)["candidates_ms"]) == ['test_scripted {"id": "a"}', 'test_scripted {"id": "b"}']


def test_a_finalist_that_fails_when_re_timed_is_dropped(scripted):
    backend = scripted([{"id": "a"}, {"id": "b"}], {"a": [1.0], "b": [0.9, MemoryError("out of memory")]})
    problem = _problem(L=15)
    with pytest.warns(UserWarning, match="failed when re-timed"):
        _, config = tuning.autotune(problem, [backend], AttentionInputs(*(torch.randn(1, 15, 2, 4),) * 3), False)
    assert config == {"id": "a"}
    assert list(tuning.cached_entry(problem)["finalists_ms"]) == ['test_scripted {"id": "a"}']


def test_tune_command_marks_the_default_and_its_distance_to_the_winner(scripted, monkeypatch, capsys):
    """``haloattn tune`` lists both phases, marks each backend's default config and says how far
    the winner's backend's default is from the winner (issue 3's "within 15 % of tuned")."""
    from haloattn import cli

    backend = scripted([{"id": "default"}, {"id": "fast"}, {"id": "slow"}],
                       {"default": [1.1], "fast": [1.0], "slow": [5.0]})
    monkeypatch.setattr(cli.DISPATCHER, "backends", lambda: [backend])
    assert cli.main(["tune", "--shape", "12", "--window", "3", "--heads", "1", "--batch", "1",
                     "--head-dim", "4", "--device", "cpu"]) == 0
    printed = capsys.readouterr().out
    assert 'test_scripted {"id": "default"}  (default)' in printed
    assert printed.count("(default)") == 2  # screened, and re-timed
    assert "test_scripted's default config takes 1.10x the winner's time" in printed
    assert 'winner: test_scripted {"id": "fast"}' in printed
