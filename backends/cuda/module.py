"""Finding ``haloattn_cuda._C`` and saying precisely why it cannot run when it cannot.

The compiled module is optional: an install without nvcc (or with ``HALOATTN_CUDA=off``) has only
the ``haloattn_cuda`` package's build record, whose ``NOT_BUILT_REASON`` says why.
"""

from __future__ import annotations

import functools
import importlib
from typing import List, Optional, Tuple

REBUILD_HINT = (
    "reinstall haloattn with nvcc (CUDA >= 12) on PATH, e.g. HALOATTN_CUDA=on pip install --no-build-isolation -e ."
)


@functools.lru_cache(maxsize=None)
def load() -> Tuple[Optional[object], Tuple[str, ...]]:
    """(the ``_C`` module or None, reasons it is unusable on this machine). Cached: the answer
    cannot change while the process runs."""
    try:
        package = importlib.import_module("haloattn_cuda")
    except ImportError:
        return None, (f"the compiled module haloattn_cuda._C is not installed; {REBUILD_HINT}",)
    not_built = getattr(package, "NOT_BUILT_REASON", "")
    if not_built:
        return None, (f"the compiled module was not built: {not_built}; {REBUILD_HINT}",)
    try:
        module = importlib.import_module("haloattn_cuda._C")
    except ImportError as exc:
        return None, (f"haloattn_cuda._C failed to import ({exc}); {REBUILD_HINT}",)
    count, error = module.device_count()
    if count < 0:
        return module, (f"no CUDA device: the CUDA runtime says {error!r}",)
    if count == 0:
        return module, ("no CUDA device",)
    return module, ()


def built_archs() -> List[str]:
    """Architectures the module was compiled for (e.g. ['90a']), empty when it was not built."""
    try:
        package = importlib.import_module("haloattn_cuda")
    except ImportError:
        return []
    archs = getattr(package, "ARCHS", "")
    return [a for a in archs.replace(",", ";").split(";") if a] if not getattr(package, "NOT_BUILT_REASON", "") else []


def capability_of(arch: str) -> Tuple[int, int]:
    """'90a' -> (9, 0)."""
    digits = arch.rstrip("af")
    return int(digits[:-1]), int(digits[-1])
