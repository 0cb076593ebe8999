"""Shared fixtures; per-worker threads and the memory watchdog."""

import os

import pytest
import torch

import haloattn
import memory_watchdog
from haloattn import tuning


def pytest_configure(config):
    """Under pytest-xdist each worker gets its share of the cores for torch's CPU threads. Left at
    torch's default (every core), twelve workers' float64 oracles ran 192 spinning OpenMP threads
    on 16 cores, and the GPU tests with the largest oracle problems, 1.6-9.4 s each alone, did not
    end within 100 s (2026-11-26, H100 machine). The memory watchdog fails a test whose memory runs
    away, instead of the OOM killer ending the whole run (tests/memory_watchdog.py)."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(workers)))
    memory_watchdog.install(config)


@pytest.fixture
def plain_cpu_environment(monkeypatch):
    """Other test modules set TRITON_INTERPRET=1 for the whole session (it makes the Triton
    backends run on CPU tensors); these tests are about the dispatcher's choices on a plain CPU
    machine, so they run without it and without a forced backend. One explain() first loads every
    backend under the session's environment: triton_window fixes its kernels' interpreter mode
    when its modules are first imported, and later modules rely on interpreted kernels."""
    if os.environ.get("TRITON_INTERPRET"):
        _q = torch.randn(1, 4, 1, 2)
        haloattn.explain(_q, _q, _q, 2, pattern="window", verbose=False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv("HALOATTN_BACKEND", raising=False)
    monkeypatch.delenv("HALOATTN_AUTOTUNE", raising=False)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """A fresh tuning cache directory (HALOATTN_CACHE_DIR), no autotuning, no forced backend, and
    no tuning file or call kept from before."""
    monkeypatch.setenv("HALOATTN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("HALOATTN_AUTOTUNE", raising=False)
    monkeypatch.delenv("HALOATTN_BACKEND", raising=False)
    tuning.forget_loaded_files()
    haloattn.clear_caches()
    yield tmp_path / "cache"
    tuning.forget_loaded_files()
    haloattn.clear_caches()
