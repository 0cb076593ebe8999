"""Shared fixtures."""

import os

import pytest
import torch

import haloattn


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
