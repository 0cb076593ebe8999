"""haloattn: fast local attention for PyTorch (neighbourhood, sliding-window, dilated, strided,
per-axis causal and Swin window attention on 1-D, 2-D and 3-D token grids)."""

import importlib

__version__ = "0.1.0"

from .api import attention, backends, clear_caches, explain, merge_attentions, register_backend  # noqa: E402
from .backend import AttentionInputs, Backend  # noqa: E402
from .dispatch import BackendUnavailableError, SlowPathWarning  # noqa: E402
from .hookspecs import hookimpl  # noqa: E402
from .problem import Problem, build_problem  # noqa: E402

__all__ = [
    "attention",
    "explain",
    "merge_attentions",
    "backends",
    "register_backend",
    "clear_caches",
    "Backend",
    "AttentionInputs",
    "BackendUnavailableError",
    "SlowPathWarning",
    "Problem",
    "build_problem",
    "hookimpl",
]

# Submodules loaded on first use, so that ``import haloattn`` stays light and
# ``haloattn.nn.NeighborhoodAttention2d`` works without importing ``haloattn.nn`` first.
_LAZY_SUBMODULES = ("nn", "integrations", "geometry")


def __getattr__(name):
    if name in _LAZY_SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'haloattn' has no attribute {name!r}")
