"""The ``haloattn`` command and the plugin/tuning machinery under bad input, on the CPU.

Bad options exit with status 2 and one ``haloattn <command>: error: ...`` line naming the
argument, the value and what is allowed (never a traceback); a bad or unwritable tuning cache is
warned about and ignored, never a crash; a misbehaving backend plugin is reported in explain() and
``haloattn info``, never breaks dispatch, and cannot displace a built-in backend. Every cache lives
under tmp_path (HALOATTN_CACHE_DIR); entry-point plugins are written as bare ``*.dist-info``
folders on PYTHONPATH of a subprocess, so this process never sees them.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

import haloattn
from delegating_backend import ReferenceDelegate
from haloattn import cli, tuning
from haloattn.dispatch import DISPATCHER, BackendUnavailableError

CPU = torch.device("cpu")
HALOATTN = Path(sys.executable).parent / "haloattn"
SMALL = ["--shape", "8", "--window", "3", "--batch", "1", "--heads", "1", "--head-dim", "4", "--device", "cpu"]

pytestmark = pytest.mark.usefixtures("plain_cpu_environment")


def run_cli(capsys, *argv):
    """(exit status, stdout, stderr) of ``haloattn argv`` in this process."""
    try:
        code = cli.main(list(argv))
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


# -- bad options ------------------------------------------------------------------------------------
BAD_PROFILE_OPTIONS = [
    (["--shape", "64x"], "argument --shape: '64x' is not a list of ints"),  # was silently a 1-D grid of 64
    (["--shape", "x"], "argument --shape: 'x' is not a list of ints"),
    (["--shape", ""], "argument --shape: '' is not a list of ints"),
    (["--shape", "a"], "argument --shape: 'a' is not a list of ints"),
    (["--shape", "0x4"], "argument --shape: '0x4': every value must be >= 1"),
    (["--shape", "-4"], "argument --shape: '-4': every value must be >= 1"),
    (["--window", "0"], "argument --window: '0': every value must be >= 1"),
    (["--window", "-3"], "argument --window: '-3': every value must be >= 1"),
    (["--window", "99"], "window 99 x dilation 1 = 99 on axis 0 exceeds the axis length 8"),
    (["--window", "3x3"], "argument --window: has 2 values but --shape has 1 axes; give 1 or 1"),
    (["--stride", "0"], "argument --stride: '0': every value must be >= 1"),
    (["--stride", "5"], "stride on axis 0 is 5; allowed: 1 <= stride <= window (3)"),
    (["--dilation", "0"], "argument --dilation: '0': every value must be >= 1"),
    (["--causal", "2"], "argument --causal: '2' is not a list of booleans"),
    (["--shift", "1"], "shift applies to pattern 'window' only"),
    (["--batch", "0"], "argument --batch: '0': it must be >= 1"),
    (["--batch", "-1"], "argument --batch: '-1': it must be >= 1"),
    (["--heads", "0"], "argument --heads: '0': it must be >= 1"),
    (["--kv-heads", "0"], "argument --kv-heads: '0': it must be >= 1"),  # was silently --heads
    (["--kv-heads", "3", "--heads", "4"], "query heads 4 is not divisible by key/value heads 3"),
    (["--head-dim", "0"], "argument --head-dim: '0': it must be >= 1"),
    (["--repeat", "0"], "argument --repeat: '0': it must be >= 1"),
    (["--dtype", "int8"], "argument --dtype: invalid choice: 'int8'"),
    (["--device", "foo"], "argument --device: 'foo' cannot be used here"),
    (["--device", ""], "argument --device: '' cannot be used here"),
    (["--device", "meta"], "argument --device: 'meta' cannot be used here"),
    (["--bogus"], "unrecognized arguments: --bogus"),
    (["--softcap", "0"], "argument --softcap: '0': it must be a finite number > 0"),
    (["--softcap", "inf"], "argument --softcap: 'inf': it must be a finite number > 0"),
    (["--extra-tokens", "-1"], "argument --extra-tokens: '-1': it must be >= 0"),
    (["--kq-conv", "3"], "argument --kq-conv: '3': expected c_q x c_k, e.g. 6x11"),
    (["--kq-conv", "2x4"], "kq_conv kernel is c_q=2 x c_k=4; c_q >= 1 and c_k must be odd"),
    (["--kq-conv", "2x3", "--shape", "8x8"], "kq_conv needs a rank-1 token grid"),
]


@pytest.mark.parametrize("extra, message", BAD_PROFILE_OPTIONS, ids=[" ".join(a) for a, _ in BAD_PROFILE_OPTIONS])
def test_profile_bad_options_are_usage_errors(cache_dir, capsys, extra, message):
    code, out, err = run_cli(capsys, "profile", *SMALL, "--repeat", "1", *extra)
    assert code == 2, (out, err)
    assert message in err and "error:" in err and "Traceback" not in err
    assert "backend" not in out  # nothing ran


@pytest.mark.skipif(torch.cuda.is_available(), reason="about a machine without CUDA")
def test_device_cuda_without_cuda_says_so(cache_dir, capsys):
    for command in ("profile", "tune", "show"):
        argv = [command, "--device", "cuda"] + (["--shape", "8", "--window", "3"] if command != "show" else [])
        code, out, err = run_cli(capsys, *argv)
        assert code == 2 and f"haloattn {command}: error: argument --device: 'cuda' cannot be used here" in err
        assert "allowed: cpu" in err


def test_bad_option_from_the_command_line_prints_no_traceback(cache_dir):
    env = dict(os.environ, HALOATTN_CACHE_DIR=str(cache_dir))
    for argv in (["profile", "--shape", "0x4"], ["profile", "--shape", "8", "--window", "99"],
                 ["tune", "--import", str(cache_dir / "missing.json")]):
        proc = subprocess.run([str(HALOATTN), *argv], capture_output=True, text=True, env=env, timeout=120)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert proc.stderr.strip().splitlines()[-1].startswith(f"haloattn {argv[0]}: error: ")


def test_help_lists_only_the_options_each_command_uses(capsys):
    code, profile_help, _ = run_cli(capsys, "profile", "--help")
    assert code == 0 and "--jvp" in profile_help and "--repeat" in profile_help
    code, tune_help, _ = run_cli(capsys, "tune", "--help")
    assert code == 0 and "--export" in tune_help and "--backward" in tune_help
    assert "--jvp" not in tune_help and "--repeat" not in tune_help  # tune does neither
    code, out, err = run_cli(capsys, "tune", *SMALL, "--jvp")
    assert code == 2 and "unrecognized arguments: --jvp" in err


# -- profile and tune on the CPU ----------------------------------------------------------------------
def test_profile_runs_the_reference_and_says_why_the_rest_do_not(cache_dir, capsys):
    code, out, err = run_cli(capsys, "profile", *SMALL, "--repeat", "1", "--backward", "--jvp", "--dtype", "fp64")
    assert code == 0, err
    header, row = [ln for ln in out.splitlines() if ln.startswith(("backend ", "reference "))]
    assert "fwd+bwd ms" in header and "jvp rel err" in header
    assert float(row.split()[-3]) < 1e-12  # float64 against the float64 reference
    assert "not run: triton:" in out


def test_profile_takes_the_learned_tables_and_additional_tokens(cache_dir, capsys):
    """--rpb, --softcap, --extra-tokens and --kq-conv reach the problem (its description names
    them) and the float64 check, forward, backward (the tables' gradients included) and JVP."""
    code, out, err = run_cli(capsys, "profile", "--shape", "24", "--window", "5", "--heads", "2", "--head-dim", "8",
                             "--rpb", "--softcap", "20", "--extra-tokens", "3", "--kq-conv", "2x3", "--repeat", "1",
                             "--backward", "--jvp", "--dtype", "fp64")
    assert code == 0, err
    assert "rpb, softcap, kq_conv, +3 tokens" in out
    row = next(ln for ln in out.splitlines() if ln.startswith("reference "))
    assert float(row.split()[-3]) < 1e-12  # float64 against the float64 reference


def test_tune_on_the_cpu_tunes_what_can_run_and_says_why_not_the_rest(cache_dir, capsys):
    code, out, err = run_cli(capsys, "tune", *SMALL)
    assert code == 0, err
    assert "winner: reference -> " + str(cache_dir) in out
    assert "not tuned: triton: " in out and "not tuned: flex: " in out
    # a lone candidate against itself: no "takes 1.00x the winner's time" line
    assert "the winner's time" not in out
    entries = json.loads(Path(tuning.cache_path(CPU)).read_text())["entries"]
    assert [e["backend"] for e in entries.values()] == ["reference"]
    code, out, _ = run_cli(capsys, "show", "--device", "cpu")
    assert code == 0 and "1 entries" in out and "-> reference null" in out


def test_tune_export_and_import_are_exclusive_and_need_a_path(cache_dir, capsys, tmp_path):
    code, _, err = run_cli(capsys, "tune", "--export", str(tmp_path / "a.json"), "--import", str(tmp_path / "a.json"))
    assert code == 2 and "not allowed with argument" in err
    for option in ("--export", "--import"):
        code, out, err = run_cli(capsys, "tune", *SMALL, option, "")
        assert code == 2 and f"argument {option}: expected a file path, got ''" in err
        assert "winner" not in out and not os.path.exists(tuning.cache_path(CPU))  # nothing was tuned
    code, _, err = run_cli(capsys, "tune", "--export", str(tmp_path / "no" / "dir" / "x.json"))
    assert code == 2 and "argument --export: cannot write" in err


def _metadata():
    return tuning.device_metadata("cpu", 0)


@pytest.mark.parametrize("content, message", [
    (None, "No such file"),
    ("{\"_metadata\": {", "cannot import"),
    ("[1, 2]", "is not an exported tuning cache"),
    ("METADATA_ENTRIES_LIST", "is not an exported tuning cache"),
    ('{"_metadata": {"device": "another"}, "entries": {}}', "import refuses results from another device"),
], ids=["missing", "truncated", "list", "entries-list", "other-device"])
def test_tune_import_of_a_bad_file_is_a_usage_error(cache_dir, capsys, tmp_path, content, message):
    path = tmp_path / "exported.json"
    if content is not None:
        path.write_text(content.replace("METADATA_ENTRIES_LIST", json.dumps({"_metadata": _metadata(), "entries": [1]})))
    code, out, err = run_cli(capsys, "tune", "--import", str(path))
    assert code == 2 and "haloattn tune: error: argument --import:" in err and message in err, err
    code, _, err = run_cli(capsys, "tune", "--import", str(tmp_path))  # a directory
    assert code == 2 and "cannot import" in err


def test_tune_import_drops_malformed_entries_and_keeps_good_ones(cache_dir, capsys, tmp_path):
    path = tmp_path / "exported.json"
    path.write_text(json.dumps({"_metadata": _metadata(), "entries": {
        "bad-int": 5, "bad-config": {"backend": "reference", "config": "abc"},
        "good": {"backend": "reference", "config": None, "ms": 1.0}}}))
    with pytest.warns(UserWarning, match="malformed tuning cache entry"):
        code, out, err = run_cli(capsys, "tune", "--import", str(path))
    assert code == 0 and "imported 1 entries" in out
    assert list(tuning.tuning_file(CPU).entries) == ["good"]
    code, out, _ = run_cli(capsys, "show", "--device", "cpu")
    assert code == 0 and "1 entries" in out


# -- a bad tuning cache never crashes the library -------------------------------------------------------
def _qkv():
    return tuple(torch.randn(1, 8, 2, 4) for _ in range(3))


def _signature(needs_grad=False):
    q, k, v = _qkv()
    return tuning.signature(haloattn.build_problem(q, k, v, 3), needs_grad)


@pytest.mark.parametrize("entry", [
    5, "reference", [1], {"config": None}, {"backend": ["reference"]}, {"backend": "reference", "config": "abc"},
    {"backend": "reference", "config": [1, 2]},
], ids=["int", "str", "list", "no-backend", "backend-list", "config-str", "config-list"])
def test_malformed_cache_entry_is_warned_about_and_ignored(cache_dir, entry):
    cache_dir.mkdir()
    Path(tuning.cache_path(CPU)).write_text(json.dumps({"_metadata": _metadata(), "entries": {_signature(): entry}}))
    q, k, v = _qkv()
    with pytest.warns(UserWarning, match="malformed tuning cache entry"):
        e = haloattn.explain(q, k, v, 3, verbose=False)
    assert (e.chosen, e.why) == ("reference", "highest priority that supports it")
    assert torch.isfinite(haloattn.attention(q, k, v, 3)).all()


def test_cache_entry_for_a_vanished_backend_is_ignored(cache_dir, capsys):
    cache_dir.mkdir()
    Path(tuning.cache_path(CPU)).write_text(json.dumps({"_metadata": _metadata(), "entries": {
        _signature(): {"backend": "uninstalled", "config": {"tile": 64}}}}))
    q, k, v = _qkv()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert haloattn.explain(q, k, v, 3, verbose=False).chosen == "reference"
        assert torch.isfinite(haloattn.attention(q, k, v, 3)).all()
    code, out, _ = run_cli(capsys, "show", "--device", "cpu")
    assert code == 0 and "-> uninstalled" in out


@pytest.mark.parametrize("content", ['{"_metadata": {"format": "1", "dev', "", "[]", "null"])
def test_corrupt_cache_file_is_ignored_then_rewritten_by_tune(cache_dir, capsys, content):
    cache_dir.mkdir()
    Path(tuning.cache_path(CPU)).write_text(content)
    with pytest.warns(UserWarning, match="it will be rewritten"):
        code, out, err = run_cli(capsys, "tune", *SMALL)
    assert code == 0 and "winner: reference" in out, err
    assert len(json.loads(Path(tuning.cache_path(CPU)).read_text())["entries"]) == 1


def test_cache_dir_that_is_a_file_warns_and_autotune_still_runs(tmp_path, monkeypatch, capsys):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    for cache in (blocker, blocker / "sub"):
        monkeypatch.setenv("HALOATTN_CACHE_DIR", str(cache))
        tuning.forget_loaded_files()
        haloattn.clear_caches()
        code, out, _ = run_cli(capsys, "info")
        assert code == 0
        if cache == blocker:
            assert f"unusable: {blocker} is not a directory" in out
        # tune says it stored nothing, with the reason, and fails
        with pytest.warns(UserWarning, match="cannot write the tuning cache"):
            code, out, err = run_cli(capsys, "tune", *SMALL)
        assert code == 1 and "haloattn tune: error: winner reference not stored: cannot write" in err
        assert "winner: reference ->" not in out
        # a training run under HALOATTN_AUTOTUNE=1 warns and goes on
        monkeypatch.setenv("HALOATTN_AUTOTUNE", "1")
        q, k, v = (torch.randn(1, 9, 2, 4, requires_grad=True) for _ in range(3))
        with pytest.warns(UserWarning, match="kept for this process only"):
            haloattn.attention(q, k, v, 3).sum().backward()
        assert torch.isfinite(q.grad).all()
        monkeypatch.delenv("HALOATTN_AUTOTUNE")
        # and an import into it is refused, naming the cause
        exported = tmp_path / "exported.json"
        exported.write_text(json.dumps({"_metadata": _metadata(), "entries": {}}))
        with pytest.warns(UserWarning):
            code, _, err = run_cli(capsys, "tune", "--import", str(exported))
        assert code == 2 and "cannot import" in err
    tuning.forget_loaded_files()
    haloattn.clear_caches()


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root writes into read-only directories")
def test_read_only_cache_dir_warns(cache_dir, capsys):
    cache_dir.mkdir()
    cache_dir.chmod(0o555)
    try:
        with pytest.warns(UserWarning, match="cannot write the tuning cache"):
            code, _, err = run_cli(capsys, "tune", *SMALL)
        assert code == 1 and "not stored" in err
    finally:
        cache_dir.chmod(0o755)


# -- plugins registered at run time ---------------------------------------------------------------
class _Runs(ReferenceDelegate):
    """Runs the reference's computation; subclasses break one method."""

    priority = 3000


@pytest.fixture
def registered(cache_dir):
    added = []

    def add(backend):
        haloattn.register_backend(backend)
        added.append(backend)
        return backend

    yield add
    for b in added:
        DISPATCHER.registry.backends.pop(b.name, None)
    haloattn.clear_caches()


def _broken(name, method, behaviour):
    def broken(self, *args):
        if isinstance(behaviour, Exception):
            raise behaviour
        return behaviour

    broken.__name__ = method
    return type(name, (_Runs,), {"name": name, method: broken})()


@pytest.mark.parametrize("method, behaviour, reason", [
    ("available", RuntimeError("driver gone"), "available raised RuntimeError: driver gone"),
    ("available", None, "available returned None; it must return a list of str"),
    ("available", "no GPU", "available returned 'no GPU'; it must return a list of str"),
    ("not_supported_reasons", RuntimeError("bad"), "not_supported_reasons raised RuntimeError: bad"),
    ("not_supported_reasons", "not today", "not_supported_reasons returned 'not today'; it must return a list of str"),
    ("not_supported_reasons", None, "not_supported_reasons returned None"),
    ("not_supported_reasons", [1], "not_supported_reasons returned [1]"),
], ids=["avail-raises", "avail-none", "avail-str", "nsr-raises", "nsr-str", "nsr-none", "nsr-ints"])
def test_misbehaving_backend_checks_are_reasons_not_crashes(registered, capsys, method, behaviour, reason):
    backend = registered(_broken(f"test_bad_{method}", method, behaviour))
    q, k, v = _qkv()
    e = haloattn.explain(q, k, v, 3, verbose=False)
    assert e.chosen == "reference"
    assert {x.name: x.reasons for x in e.verdicts}[backend.name][0].startswith(reason)
    assert reason in str(e)
    assert torch.isfinite(haloattn.attention(q, k, v, 3)).all()
    with pytest.raises(BackendUnavailableError, match=re.escape(reason)):
        haloattn.attention(q, k, v, 3, backend=backend.name)
    code, out, err = run_cli(capsys, "info")
    assert code == 0 and backend.name in out, err
    if method == "available":
        assert f"unavailable: {reason}" in out
        assert backend.name in haloattn.backends(all=True) and backend.name not in haloattn.backends()


@pytest.mark.parametrize("make, error, message", [
    (lambda: type("P", (_Runs,), {"name": "test_p", "priority": "high"})(), TypeError, "priority='high'; it must be an int"),
    (lambda: type("P", (_Runs,), {"name": "test_p", "priority": 1.5})(), TypeError, "priority=1.5; it must be an int"),
    (lambda: type("P", (_Runs,), {"name": "test_p", "priority": True})(), TypeError, "priority=True; it must be an int"),
    (lambda: type("P", (_Runs,), {"name": ""})(), ValueError, "has name=''"),
    (lambda: type("P", (_Runs,), {"name": 7})(), ValueError, "has name=7"),
    (lambda: _Runs(), ValueError, "has name='unnamed'; set its class attribute name"),
    (lambda: type("P", (_Runs,), {"name": "a,b"})(), ValueError, "may not contain commas or whitespace"),
    (lambda: type("P", (_Runs,), {"name": "a b"})(), ValueError, "may not contain commas or whitespace"),
    (lambda: type("P", (_Runs,), {"name": "reference"})(), ValueError, "'reference' is already registered"),
    (lambda: _Runs, TypeError, "got the class _Runs; pass _Runs()"),
    (lambda: None, TypeError, "expects a haloattn.Backend instance, got NoneType"),
    (lambda: "reference", TypeError, "expects a haloattn.Backend instance, got str"),
], ids=["prio-str", "prio-float", "prio-bool", "name-empty", "name-int", "name-unset", "name-comma", "name-space",
        "name-builtin", "class", "none", "str"])
def test_register_backend_refuses_bad_objects_and_keeps_working(cache_dir, make, error, message):
    before = haloattn.backends(all=True)
    with pytest.raises(error, match=re.escape(message)):
        haloattn.register_backend(make())
    assert haloattn.backends(all=True) == before  # a refused backend left nothing behind
    q, k, v = _qkv()
    assert haloattn.explain(q, k, v, 3, verbose=False).chosen == "reference"


def test_haloattn_backend_env_forces_a_runtime_plugin(registered, monkeypatch):
    class Rank1(_Runs):
        name = "test_rank1"
        priority = -10  # below the reference: chosen only when forced

        def not_supported_reasons(self, problem):
            return [] if problem.rank == 1 else [f"rank {problem.rank}: rank 1 only"]

    registered(Rank1())
    q, k, v = _qkv()
    assert haloattn.explain(q, k, v, 3, verbose=False).chosen == "reference"
    monkeypatch.setenv("HALOATTN_BACKEND", "test_rank1")
    e = haloattn.explain(q, k, v, 3, verbose=False)
    assert (e.chosen, e.why) == ("test_rank1", "forced by HALOATTN_BACKEND")
    q2 = torch.randn(1, 5, 5, 2, 4)
    e2 = haloattn.explain(q2, q2, q2, 3, verbose=False)
    assert e2.chosen is None and "rank 2: rank 1 only" in str(e2)
    with pytest.raises(BackendUnavailableError, match="rank 2: rank 1 only"):
        haloattn.attention(q2, q2, q2, 3)
    monkeypatch.setenv("HALOATTN_BACKEND", "test_rank1,reference")
    assert haloattn.explain(q2, q2, q2, 3, verbose=False).chosen == "reference"
    monkeypatch.setenv("HALOATTN_BACKEND", "test_nosuch")
    with pytest.raises(ValueError, match="HALOATTN_BACKEND='test_nosuch'.*does not exist"):
        haloattn.attention(q, k, v, 3)


def _misreturning(name, method, bad):
    """A _Runs backend whose ``method`` returns ``bad(correct result)``."""
    def wrapped(self, *args):
        return bad(getattr(_Runs, method)(self, *args))

    return type(name, (_Runs,), {"name": name, method: wrapped})()


@pytest.mark.parametrize("method, bad, message", [
    ("forward", lambda r: (r[0][:, :-1], r[1]), "returned out [1, 7, 2, 4] float32 on cpu and lse [1, 8, 2] float32"),
    ("forward", lambda r: (r[0].double(), r[1]), "out [1, 8, 2, 4] float64 on cpu and lse [1, 8, 2] float32"),
    ("forward", lambda r: (r[0], r[1].half()), "lse [1, 8, 2] float16 on cpu from its forward; expected (out, lse)"),
    ("forward", lambda r: r[0], "returned [1, 8, 2, 4] float32 on cpu from its forward; expected (out, lse)"),
    ("backward", lambda g: g[:3], "returned a tuple of 3 from its backward; expected 7 gradients"),
    ("backward", lambda g: (g[0], None, *g[2:]), "returned NoneType as the gradient of key, which needs one"),
    ("backward", lambda g: (g[0][:, :-1], *g[1:]), "returned [1, 7, 2, 4] float32 on cpu as the gradient of query"),
], ids=["out-shape", "out-dtype", "lse-dtype", "no-pair", "grad-count", "grad-missing", "grad-shape"])
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_backend_results_that_break_the_contract_raise_naming_the_backend(registered, method, bad, message,
                                                                          compiled):
    """A plugin's forward or backward result of the wrong shape, dtype or count raises a
    RuntimeError naming the backend, eagerly and under torch.compile. Before: eager calls returned
    the wrong tensors as they were; the compiled op passed a wrong dtype on past its fake's promise
    and failed on a wrong shape blaming haloattn's fake; a gradient left out (None) read as "no
    gradient" (autograd.grad: "appears to not have been used in the graph"; the custom op:
    AttributeError deep inside); a short list gave "expected 10, got 6"."""
    backend = registered(_misreturning(f"test_bad_{method}", method, bad))
    q, k, v = (t.requires_grad_(method == "backward") for t in _qkv())

    def call(q, k, v):
        return haloattn.attention(q, k, v, 3, backend=backend.name)

    run = torch.compile(call, backend="eager", fullgraph=True) if compiled else call
    with pytest.raises(RuntimeError, match=re.escape(message)) as info:
        out = run(q, k, v)
        if method == "backward":
            torch.autograd.grad(out.sum(), (q, k, v))
    assert f"haloattn: backend {backend.name!r} returned" in str(info.value)


def test_profile_reports_a_failing_backend_and_runs_the_others(registered, capsys):
    """``haloattn profile`` with a plugin whose forward raises, or returns the wrong shape: a
    'failed:' line naming it, every other row still printed, exit status 1 (it used to end with the
    plugin's traceback, or a shape error from inside the error column, and no table)."""
    class Raises(_Runs):
        name = "test_raises"

        def forward(self, problem, inputs, config=None):
            raise RuntimeError("kernel exploded")

    registered(Raises())
    registered(_misreturning("test_short", "forward", lambda r: (r[0][:, :-1], r[1])))
    code, out, err = run_cli(capsys, "profile", *SMALL, "--backward", "--repeat", "1")
    assert code == 1, err
    assert "failed: test_raises: RuntimeError: kernel exploded" in out
    assert "failed: test_short: RuntimeError: haloattn: backend 'test_short' returned out [1, 7, 1, 4]" in out
    assert re.search(r"^reference +[0-9.]+ ", out, re.M)


@pytest.mark.parametrize("configs, warning", [
    (RuntimeError("configs broke"), "configs() failed (RuntimeError: configs broke); tuning its default (None) only"),
    (None, "configs() failed (TypeError: returned None; it must return a list"),
    ([], "offered no usable config; tuning its default (None)"),
    ([None, "fast"], "offered config 'fast', which is neither None nor a dict of JSON values"),
    ([None, {"dtype": torch.float16}], "offered config {'dtype': torch.float16}, which is neither None nor a dict"),
], ids=["raises", "none", "empty", "str", "not-json"])
def test_autotune_survives_a_plugins_bad_configs(registered, monkeypatch, configs, warning):
    """Under HALOATTN_AUTOTUNE=1, a plugin whose configs() raises or answers with no list of
    None/JSON dicts is tuned on its default and warned about. Before: every call raised (even those
    other backends would run), a str config was stored and refused by every later read, and an
    empty list left the backend out of the tuning silently."""
    class Offers(_Runs):
        name = "test_configs"

        def configs(self, problem):
            if isinstance(configs, Exception):
                raise configs
            return configs

    registered(Offers())
    monkeypatch.setenv("HALOATTN_AUTOTUNE", "1")
    q, k, v = _qkv()
    with pytest.warns(UserWarning, match=re.escape(warning)):
        haloattn.attention(q, k, v, 3)
    entry = tuning.cached_entry(haloattn.build_problem(q, k, v, 3))
    assert any(label.startswith("test_configs") for label in entry["candidates_ms"])
    assert entry["config"] is None or isinstance(entry["config"], dict)


def test_autotune_hands_a_config_over_as_the_cache_stores_it(registered, monkeypatch):
    """A config with a tuple is timed as JSON gives it back ({"tile": [64, 64]}), so the process
    that tuned runs what every later one reads from the cache."""
    seen = []

    class Tuples(_Runs):
        name = "test_tuples"

        def configs(self, problem):
            return [{"tile": (64, 64)}]

        def forward(self, problem, inputs, config=None):
            seen.append(config)
            return _Runs.forward(self, problem, inputs, config)

    registered(Tuples())
    monkeypatch.setenv("HALOATTN_AUTOTUNE", "1")
    q, k, v = _qkv()
    haloattn.attention(q, k, v, 3, backend="test_tuples")
    assert seen and all(c == {"tile": [64, 64]} for c in seen)


# -- plugins installed through entry points ------------------------------------------------------------
PLUGIN = '''
from haloattn import Backend, hookimpl

class Impostor(Backend):
    name = {name!r}
    priority = 500
    def not_supported_reasons(self, problem):
        return []
    def forward(self, problem, inputs, config=None):
        raise RuntimeError("the impostor ran")

@hookimpl
def haloattn_register_backends(registry):
    registry.add(Impostor())
'''


def _site(tmp_path, entry_points, modules):
    """A folder that, on PYTHONPATH, installs a distribution with these entry points."""
    site = tmp_path / "site"
    info = site / "impostor_plugin-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: impostor-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[haloattn.backends]\n" + "".join(f"{k} = {v}\n" for k, v in entry_points.items()))
    for name, source in modules.items():
        (site / f"{name}.py").write_text(source)
    return site


def _run(site, cache_dir, code, *argv, **env):
    full = {k: v for k, v in os.environ.items() if not k.startswith(("HALOATTN_", "TRITON_INTERPRET"))}
    full.update(PYTHONPATH=str(site), HALOATTN_CACHE_DIR=str(cache_dir), **env)
    command = [sys.executable, "-c", textwrap.dedent(code)] if code else [str(HALOATTN), *argv]
    return subprocess.run(command, capture_output=True, text=True, env=full, timeout=120)


def test_plugins_cannot_displace_builtin_backends(tmp_path, cache_dir):
    """A plugin whose backend is named like a built-in, or whose entry point is, fails to load with
    the reason (in ``haloattn info`` and in the forcing error), and the built-in keeps working,
    whatever order sys.path lists the distributions in."""
    site = _site(tmp_path, {"impostor": "impostor_backend", "reference": "impostor_entry", "good": "good_plugin"}, {
        "impostor_backend": PLUGIN.format(name="reference"),
        "impostor_entry": PLUGIN.format(name="entry_impostor"),
        "good_plugin": PLUGIN.format(name="good").replace('raise RuntimeError("the impostor ran")',
                                                         "return Backend.forward(self, problem, inputs)"),
    })
    info = _run(site, cache_dir, None, "info")
    assert info.returncode == 0, info.stderr
    assert "impostor       plugin failed to load: ValueError: a backend named 'reference' is already registered" in info.stdout
    assert "reference (impostor_entry) plugin failed to load: entry point name 'reference' is already taken" in info.stdout
    assert "good           priority  500  available" in info.stdout
    assert "reference      priority    0  available" in info.stdout and "entry_impostor" not in info.stdout
    proc = _run(site, cache_dir, """
        import torch, haloattn
        q = torch.randn(1, 8, 2, 4)
        haloattn.attention(q, q, q, 3, backend="reference")  # the built-in, not the impostor
        try:
            haloattn.attention(q, q, q, 3, backend="impostor")
        except ValueError as exc:
            print("FORCED:", exc)
        print("CHOSEN:", haloattn.explain(q, q, q, 3, verbose=False).chosen)
    """, HALOATTN_BACKEND="")
    assert proc.returncode == 0, proc.stderr
    assert "FORCED: backend='impostor' does not exist (plugin 'impostor' failed to load: ValueError: a backend named" in proc.stdout
    assert "CHOSEN: good" in proc.stdout
    # a disabled plugin is not loaded, so not reported either
    info = _run(site, cache_dir, None, "info", HALOATTN_DISABLED_PLUGINS="impostor,good")
    assert "impostor " not in info.stdout and "good " not in info.stdout and "reference (impostor_entry)" in info.stdout


@pytest.mark.parametrize("config", [{"fwd": 5}, {"fwd": {"q": "x"}}, {"fwd": {"q": [0]}}, {"dq": {"kv": [-16]}},
                                    {"fwd": {"q": [16, 16]}}, {"dkdv": {"q": [True]}}, {"nonsense": 1}])
def test_triton_fits_a_stale_cached_config_to_the_problem(config):
    """A config from the cache that the triton backend cannot use (hand-edited, another release)
    falls back to the default tile shapes: it used to fail deep in the launch, or, with a 0 in a
    tile shape, loop forever in tiles.fit."""
    import signal

    from haloattn.backends.triton import tiles

    q = torch.randn(1, 8, 1, 16)
    problem = haloattn.build_problem(q, q, q, 3)
    previous = signal.signal(signal.SIGALRM, lambda *_: pytest.fail("tiles.normalise did not return"))
    signal.alarm(20)
    try:
        fitted = tiles.normalise(config, problem)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    default = tiles.normalise(None, problem)
    for kernel in default:
        assert (fitted[kernel]["q"], fitted[kernel]["kv"]) == (default[kernel]["q"], default[kernel]["kv"])
