"""device_constants: tables built once per key (on CPU the helper thread is not involved)."""

import torch

from haloattn.backends.triton import device_constants


def test_built_once_per_key_and_kept(monkeypatch):
    monkeypatch.setattr(device_constants, "_CONSTANTS", {})
    builds = []

    def build():
        builds.append(1)
        return torch.arange(5)

    device = torch.device("cpu")
    first = device_constants.device_constant(("t", 5, device), device, build)
    again = device_constants.device_constant(("t", 5, device), device, build)
    other = device_constants.device_constant(("t", 6, device), device, build)
    assert first is again and other is not first
    assert len(builds) == 2
    assert torch.equal(first, torch.arange(5))


def test_cache_is_bounded(monkeypatch):
    monkeypatch.setattr(device_constants, "_CONSTANTS", {})
    monkeypatch.setattr(device_constants, "CACHE_LIMIT", 3)
    device = torch.device("cpu")
    for n in range(7):
        device_constants.device_constant(("t", n, device), device, lambda n=n: torch.full((1,), n))
    assert len(device_constants._CONSTANTS) <= 3
