"""Device tensors computed once per process (index tables) and kept for later calls.

A cached device tensor must not live in a CUDA-graph memory pool: ``torch.compile``'s CUDA graphs
(``mode="reduce-overhead"``) warm up and record with every allocation of the recording thread
routed into the graph's private pool, and refuse to go on when a tensor of that pool outlives the
graph's outputs ("tensor(s) in the cudagraph pool not tracked as outputs"). A table first needed
inside such a region is therefore built by a helper thread, whose allocations the pool does not
take, and the helper waits for its kernels before handing the tensors over. While a stream is
being captured the table is built as part of the graph and not cached (a later eager call
caches it).
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Dict, Hashable

import torch

CACHE_LIMIT = 256
_CONSTANTS: Dict[Hashable, object] = {}
_BUILDER: list = []  # the helper thread's executor, made on first use
_ON_BUILDER = threading.local()  # set on the helper thread: a table built from another builds in place


def device_constant(key: Hashable, device: torch.device, build: Callable[[], object]):
    """``build()``'s result for ``key`` (whose parts must include ``device``), built once."""
    value = _CONSTANTS.get(key)
    if value is not None:
        return value
    if device.type != "cuda" or getattr(_ON_BUILDER, "active", False):
        value = build()
    elif torch.cuda.is_current_stream_capturing():
        return build()
    else:
        if not _BUILDER:
            _BUILDER.append(ThreadPoolExecutor(max_workers=1, thread_name_prefix="haloattn-constants"))
        value = _BUILDER[0].submit(_build_on, device, build).result()
    if len(_CONSTANTS) >= CACHE_LIMIT:
        _CONSTANTS.clear()
    _CONSTANTS[key] = value
    return value


def _build_on(device: torch.device, build: Callable[[], object]):
    _ON_BUILDER.active = True
    try:
        with torch.cuda.device(device):
            value = build()
            torch.cuda.current_stream(device).synchronize()
    finally:
        _ON_BUILDER.active = False
    return value
