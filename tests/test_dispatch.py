"""Dispatcher: a third-party backend package installed through its entry point, a broken plugin,
forcing by argument and environment, priority lists, explain(), backends(), HALOATTN_LOG=debug,
HALOATTN_DISABLED_PLUGINS and register_backend() at run time.

The plugin packages (tests/plugin_pkg, tests/broken_plugin_pkg) are pip-installed once per
session into a temporary target directory; each scenario runs in a subprocess with that directory
on PYTHONPATH, so the main test process never sees the toy plugins.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

import haloattn
import oracle
from haloattn.dispatch import DISPATCHER, BackendUnavailableError

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def plugin_site(tmp_path_factory):
    pytest.importorskip("setuptools", reason="building the test plugin packages needs setuptools (test extra)")
    root = tmp_path_factory.mktemp("plugins")
    sources = []
    for name in ("plugin_pkg", "broken_plugin_pkg"):
        # build from a copy: an in-tree build would leave build/ and *.egg-info in tests/
        shutil.copytree(HERE / name, root / name)
        sources.append(str(root / name))
    site = root / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--disable-pip-version-check", "--no-index", "--target", str(site), *sources],
        check=True, capture_output=True, text=True,
    )
    assert (site / "haloattn_toy" / "plugin.py").exists()
    return site


pytestmark = pytest.mark.usefixtures("plain_cpu_environment")


PRELUDE = """
import json, logging, os, sys
import torch
import haloattn
from haloattn.dispatch import DISPATCHER, BackendUnavailableError

def qkv(*spatial, dtype=torch.float64):
    return tuple(torch.randn(1, *spatial, 2, 4, dtype=dtype) for _ in range(3))

result = {}
"""


def run_script(site, body, **env):
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("HALOATTN_")}
    full_env["PYTHONPATH"] = os.pathsep.join([str(site), full_env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    full_env.update(env)
    code = PRELUDE + textwrap.dedent(body) + "\nprint('RESULT=' + json.dumps(result))\n"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full_env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT=")][-1]
    return json.loads(line[len("RESULT="):]), proc.stdout, proc.stderr


def test_toy_plugin_is_chosen_explained_and_forced(plugin_site):
    result, stdout, stderr = run_script(plugin_site, """
        from haloattn_toy.plugin import CALLS
        result["installed"] = haloattn.backends(all=True)
        result["available"] = haloattn.backends()
        q, k, v = qkv(9)
        e1 = haloattn.explain(q, k, v, 3, verbose=False)
        result["rank1_chosen"], result["rank1_why"] = e1.chosen, e1.why
        out = haloattn.attention(q, k, v, 3)
        ref = haloattn.attention(q, k, v, 3, backend="reference")
        result["toy_forward_calls"] = CALLS["forward"]
        result["same_as_reference"] = torch.equal(out, ref)
        # backward runs through the toy backend too
        q.requires_grad_()
        haloattn.attention(q, k, v, 3).sum().backward()
        result["toy_backward_calls"] = CALLS["backward"]

        q2, k2, v2 = qkv(5, 6)
        print("EXPLAIN-BEGIN")
        e2 = haloattn.explain(q2, k2, v2, 3)  # prints the table
        print("EXPLAIN-END")
        result["rank2_chosen"] = e2.chosen
        result["verdicts"] = {v.name: v.reasons for v in e2.verdicts}
        before = CALLS["forward"]
        haloattn.attention(q2, k2, v2, 3)
        result["rank2_used_toy"] = CALLS["forward"] != before
        try:
            haloattn.attention(q2, k2, v2, 3, backend="toy")
            result["forced_rank2"] = "ran"
        except BackendUnavailableError as exc:
            result["forced_rank2"] = str(exc)
        result["forced_rank2_calls"] = CALLS["forward"] - before
        # kq_conv on rank 1: toy says why, the reference runs it
        e3 = haloattn.explain(q, k, v, 3, kq_conv=torch.randn(2, 1, 3, dtype=torch.float64), verbose=False)
        result["kq_chosen"] = e3.chosen
        result["kq_toy_reasons"] = [v.reasons for v in e3.verdicts if v.name == "toy"][0]
    """)
    assert "toy" in result["installed"] and "reference" in result["installed"]
    assert "toy" in result["available"]
    assert result["rank1_chosen"] == "toy" and "highest priority" in result["rank1_why"]
    assert result["toy_forward_calls"] == 1 and result["same_as_reference"]
    assert result["toy_backward_calls"] == 1
    assert result["rank2_chosen"] == "reference" and not result["rank2_used_toy"]
    assert result["verdicts"]["toy"] == ["toy runs rank-1 grids only; this one has rank 2"]
    assert result["verdicts"]["reference"] == []
    table = stdout.split("EXPLAIN-BEGIN")[1].split("EXPLAIN-END")[0]
    assert "toy" in table and "rank-1 grids only" in table and "reference" in table
    assert "would run: reference" in table
    assert "rank-1 grids only; this one has rank 2" in result["forced_rank2"]
    assert "forced by backend=" in result["forced_rank2"]
    assert result["forced_rank2_calls"] == 0  # never a silent fallback, never a partial run
    assert result["kq_chosen"] == "reference" and result["kq_toy_reasons"] == ["toy has no kq_conv"]


def test_environment_forcing_and_priority_lists(plugin_site):
    """HALOATTN_BACKEND set at start-up, then changed at run time (honoured, not stuck in a
    cache), and the backend= argument as a priority list."""
    r, _, _ = run_script(plugin_site, """
        from haloattn_toy.plugin import CALLS
        q1, k1, v1 = qkv(9)
        q2, k2, v2 = qkv(5, 6)

        def scenario():
            haloattn.clear_caches()
            res = {}
            e1 = haloattn.explain(q1, k1, v1, 3, verbose=False)
            res["rank1"], res["rank1_why"] = e1.chosen, e1.why
            res["rank2"] = haloattn.explain(q2, k2, v2, 3, verbose=False).chosen
            try:
                haloattn.attention(q2, k2, v2, 3)
                res["rank2_error"] = None
            except BackendUnavailableError as exc:
                res["rank2_error"] = str(exc)
            before = CALLS["forward"]
            haloattn.attention(q1, k1, v1, 3)
            res["toy_ran"] = CALLS["forward"] - before
            # the argument wins over the environment
            res["arg_over_env"] = haloattn.explain(q1, k1, v1, 3, backend="reference", verbose=False).chosen
            return res

        result["startup"] = scenario()
        for value in ("reference,toy", "toy", "", "toy,bogus"):
            os.environ["HALOATTN_BACKEND"] = value
            try:
                result[value] = scenario()
            except ValueError as exc:
                result[value] = str(exc)
        del os.environ["HALOATTN_BACKEND"]
        haloattn.clear_caches()
        before = CALLS["forward"]
        haloattn.attention(q1, k1, v1, 3, backend="reference,toy")
        result["arg_ref_first"] = CALLS["forward"] - before
        haloattn.attention(q1, k1, v1, 3, backend="toy,reference")
        result["arg_toy_first"] = CALLS["forward"] - before
        haloattn.attention(q2, k2, v2, 3, backend="toy,reference")
        result["arg_toy_first_rank2"] = CALLS["forward"] - before
    """, HALOATTN_BACKEND="toy,reference")
    r0 = r["startup"]
    assert r0["rank1"] == "toy" and r0["rank2"] == "reference" and r0["rank2_error"] is None
    assert "HALOATTN_BACKEND" in r0["rank1_why"]
    assert r0["toy_ran"] == 1 and r0["arg_over_env"] == "reference"

    r1 = r["reference,toy"]
    assert r1["rank1"] == "reference" and r1["rank2"] == "reference" and r1["toy_ran"] == 0

    r2 = r["toy"]
    assert r2["rank1"] == "toy" and r2["rank2"] is None and r2["toy_ran"] == 1
    assert "HALOATTN_BACKEND" in r2["rank2_error"] and "rank-1 grids only; this one has rank 2" in r2["rank2_error"]
    assert r2["arg_over_env"] == "reference"

    r3 = r[""]  # empty means unset: priority order
    assert r3["rank1"] == "toy" and "highest priority" in r3["rank1_why"] and r3["rank2"] == "reference"

    assert "'bogus' does not exist" in r["toy,bogus"] and "toy" in r["toy,bogus"]
    assert (r["arg_ref_first"], r["arg_toy_first"], r["arg_toy_first_rank2"]) == (0, 1, 1)


def test_broken_plugins_are_logged_and_skipped(plugin_site):
    r, _, stderr = run_script(plugin_site, """
        q, k, v = qkv(9)
        out = haloattn.attention(q, k, v, 3)
        result["works"] = bool(torch.isfinite(out).all())
        result["errors"] = dict(DISPATCHER.plugin_errors)
        result["installed"] = haloattn.backends(all=True)
        result["explain"] = str(haloattn.explain(q, k, v, 3, verbose=False))
    """)
    assert r["works"] and "toy" in r["installed"]
    assert "toy_broken exploded on import" in r["errors"]["toy_broken"]
    assert "RuntimeError" in r["errors"]["toy_broken"]
    assert "toy_badhook failed while registering" in r["errors"]["toy_badhook"]
    assert "skipping backend plugin 'toy_broken'" in stderr
    assert "'toy_badhook' failed to register" in stderr
    assert "plugin 'toy_broken' failed to load" in r["explain"]

    r, _, stderr = run_script(plugin_site, """
        q, k, v = qkv(9)
        haloattn.attention(q, k, v, 3)
        result["errors"] = dict(DISPATCHER.plugin_errors)
        result["installed"] = haloattn.backends(all=True)
    """, HALOATTN_DISABLED_PLUGINS="toy_broken, toy_badhook,toy")
    assert "toy_broken" not in r["errors"] and "toy_badhook" not in r["errors"]
    assert "toy_broken" not in stderr and "toy_badhook" not in stderr
    assert "toy" not in r["installed"] and "reference" in r["installed"]
    assert "-> backend" not in stderr  # no choice log without HALOATTN_LOG=debug


def test_debug_log_once_per_choice(plugin_site):
    _, _, stderr = run_script(plugin_site, """
        q, k, v = qkv(9)
        for _ in range(3):
            haloattn.attention(q, k, v, 3)
        q2, k2, v2 = qkv(4, 5)
        for _ in range(2):
            haloattn.attention(q2, k2, v2, 3)
        haloattn.clear_caches()
        haloattn.attention(q, k, v, 3)
    """, HALOATTN_LOG="debug", HALOATTN_DISABLED_PLUGINS="toy_broken,toy_badhook")
    lines = [ln for ln in stderr.splitlines() if "-> backend" in ln]
    assert len(lines) == 3, stderr
    assert "rank 1 grid 9" in lines[0] and "'toy'" in lines[0]
    assert "rank 2 grid 4x5" in lines[1] and "'reference'" in lines[1]


# ---------------------------------------------------------------------------------------------
# In-process: register_backend at run time, backends(), forcing errors


class _Unavailable(haloattn.Backend):
    name = "test_unavailable"
    priority = 1000

    def available(self):
        return ["needs a device this machine lacks"]

    def not_supported_reasons(self, problem):
        return []


class _Picky(haloattn.Backend):
    """Wraps the reference, float64 only, highest priority."""

    name = "test_picky"
    priority = 999
    calls = 0

    def not_supported_reasons(self, problem):
        return [] if problem.dtype == torch.float64 else [f"dtype {problem.dtype} is not float64"]

    def forward(self, problem, inputs, config=None):
        type(self).calls += 1
        return DISPATCHER.get("reference").forward(problem, inputs, config)

    def backward(self, problem, inputs, out, lse, grad_out, grad_lse, needs_grad, config=None):
        type(self).gradient_strides = (grad_out.stride(), grad_lse.stride() if grad_lse is not None else None)
        return DISPATCHER.get("reference").backward(problem, inputs, out, lse, grad_out, grad_lse, needs_grad, config)


@pytest.fixture
def runtime_backends(monkeypatch):
    monkeypatch.delenv("HALOATTN_BACKEND", raising=False)
    monkeypatch.delenv("HALOATTN_AUTOTUNE", raising=False)
    added = [_Unavailable(), _Picky()]
    for b in added:
        haloattn.register_backend(b)
    yield added
    for b in added:
        DISPATCHER.registry.backends.pop(b.name, None)
    haloattn.clear_caches()


def test_backends_get_gradients_of_sums_with_rows_of_their_own(runtime_backends):
    # out.sum() and lse.sum() hand autograd expanded (zero-stride) gradients; backends get real rows.
    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 9, 2, 4, dtype=torch.float64, generator=gen, requires_grad=True) for _ in range(3))
    out, lse = haloattn.attention(q, k, v, 3, return_lse=True)
    grads = torch.autograd.grad(out.sum() + lse.sum(), [q, k, v])
    grad_out_strides, grad_lse_strides = _Picky.gradient_strides
    assert 0 not in grad_out_strides and 0 not in grad_lse_strides
    ref = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    ref_out, ref_lse = oracle.attention(*ref, 3)
    ref_grads = torch.autograd.grad(ref_out.sum() + ref_lse.sum(), ref)
    for g, r in zip(grads, ref_grads):
        assert oracle.rel_error(g, r) <= oracle.TOLERANCE[torch.float64]


def test_register_backend_at_run_time(runtime_backends):
    q, k, v = (torch.randn(1, 8, 2, 4, dtype=torch.float64) for _ in range(3))
    assert "test_picky" in haloattn.backends() and "test_unavailable" not in haloattn.backends()
    assert "test_unavailable" in haloattn.backends(all=True)
    before = _Picky.calls
    out = haloattn.attention(q, k, v, 3)
    assert _Picky.calls == before + 1
    assert torch.equal(out, haloattn.attention(q, k, v, 3, backend="reference"))
    e = haloattn.explain(q, k, v, 3, verbose=False)
    assert e.chosen == "test_picky"
    verdicts = {v.name: v.reasons for v in e.verdicts}
    assert verdicts["test_unavailable"] == ["needs a device this machine lacks"]
    # float32: picky says why, the reference runs
    e32 = haloattn.explain(q.float(), k.float(), v.float(), 3, verbose=False)
    assert e32.chosen == "reference"
    assert {v.name: v.reasons for v in e32.verdicts}["test_picky"] == ["dtype torch.float32 is not float64"]
    with pytest.raises(BackendUnavailableError, match="needs a device this machine lacks"):
        haloattn.attention(q, k, v, 3, backend="test_unavailable")
    with pytest.raises(BackendUnavailableError, match="is not float64"):
        haloattn.attention(q.float(), k.float(), v.float(), 3, backend="test_picky")
    # a priority list where nothing can run: every forced backend's reason is in the message
    with pytest.raises(BackendUnavailableError) as info:
        haloattn.attention(q.float(), k.float(), v.float(), 3, backend="test_unavailable,test_picky")
    assert "needs a device this machine lacks" in str(info.value) and "is not float64" in str(info.value)
    assert "test_unavailable, test_picky" in str(info.value)
    # a duplicate name is refused; a non-Backend is refused
    with pytest.raises(ValueError, match="already registered"):
        haloattn.register_backend(_Picky())
    with pytest.raises(TypeError, match="haloattn.Backend"):
        haloattn.register_backend(object())


def test_explain_prints_and_returns(runtime_backends, capsys):
    q, k, v = (torch.randn(1, 6, 6, 2, 4) for _ in range(3))
    e = haloattn.explain(q, k, v, 3, causal=(True, False))
    printed = capsys.readouterr().out
    assert str(e) == printed.rstrip("\n")
    assert "would run: reference" in printed and "test_picky" in printed and "is not float64" in printed
    assert "causal TxF" in printed
    assert {v.name for v in e.verdicts} >= {"reference", "test_picky", "test_unavailable"}
    quiet = haloattn.explain(q, k, v, 3, verbose=False)
    assert capsys.readouterr().out == "" and quiet.chosen == "reference"


def test_not_supported_reasons_that_raise_are_reported(monkeypatch):
    class Raises(haloattn.Backend):
        name = "test_raises"
        priority = 2000

        def not_supported_reasons(self, problem):
            raise KeyError("oops")

    haloattn.register_backend(Raises())
    try:
        q, k, v = (torch.randn(1, 8, 2, 4) for _ in range(3))
        e = haloattn.explain(q, k, v, 3, verbose=False)
        assert e.chosen == "reference"
        assert "not_supported_reasons raised KeyError" in {v.name: v.reasons for v in e.verdicts}["test_raises"][0]
        assert torch.isfinite(haloattn.attention(q, k, v, 3)).all()
    finally:
        DISPATCHER.registry.backends.pop("test_raises", None)
        haloattn.clear_caches()


def test_accelerator_problem_on_the_reference_backend_warns_with_reasons(runtime_backends):
    """A non-CPU problem that every faster backend declines must not go slow silently."""
    from haloattn import SlowPathWarning

    q = torch.randn(1, 6, 6, 2, 4, device="meta")  # meta stands in for an accelerator device
    problem = haloattn.build_problem(q, q, q, 3)
    with pytest.warns(SlowPathWarning, match=r"reference backend \(slow\).*test_picky: dtype torch.float32 is not float64"):
        chosen, _ = DISPATCHER.select(problem, None)
    assert chosen.name == "reference"
    # a deliberate choice, and CPU problems (where the reference is the right backend), stay quiet
    haloattn.clear_caches()
    with warnings.catch_warnings():
        warnings.simplefilter("error", SlowPathWarning)
        DISPATCHER.select(problem, "reference")
        cpu = torch.randn(1, 6, 6, 2, 4)
        haloattn.attention(cpu, cpu, cpu, 3)


def test_backends_run_on_their_inputs_device(monkeypatch):
    """Kernel launchers use the current CUDA device: the core makes it the inputs' device around
    every backend call (here: inputs on cuda:1 while cuda:0 is current)."""
    from haloattn import backend as backend_module

    entered = []

    class FakeDeviceGuard:
        def __init__(self, device):
            self.device = device

        def __enter__(self):
            entered.append(self.device)

        def __exit__(self, *exc):
            entered.append("exit")

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "device", FakeDeviceGuard)
    with backend_module.on_device(torch.device("cuda", 1)):
        pass
    assert entered == [torch.device("cuda", 1), "exit"]
    entered.clear()
    with backend_module.on_device(torch.device("cuda", 0)), backend_module.on_device(torch.device("cpu")):
        pass
    assert entered == []  # already current, or not CUDA: nothing to switch


@pytest.mark.parametrize("processor,expected", [("", "  cpu: x86_64, 7 cores"),
                                                ("Intel64 Family 6", "  cpu: x86_64 Intel64 Family 6, 7 cores")])
def test_info_names_the_cpu_without_a_gap(monkeypatch, capsys, processor, expected):
    """``haloattn info``'s CPU line: the processor name where the platform gives one, and no stray
    space before the comma where it gives none (most Linux machines)."""
    import platform

    from haloattn.cli import main

    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(platform, "processor", lambda: processor)
    monkeypatch.setattr("os.cpu_count", lambda: 7)
    assert main(["info"]) == 0
    assert expected in capsys.readouterr().out.splitlines()


def test_explain_lines_up_every_backend_name():
    """The priority column starts at one place for every row, triton_window's 13 letters included."""
    q = torch.randn(1, 16, 2, 8)
    rows = [ln for ln in str(haloattn.explain(q, q, q, 5, verbose=False)).splitlines() if ln.startswith("  ")]
    assert len(rows) >= 2 and len({ln.index(" priority ") for ln in rows}) == 1
