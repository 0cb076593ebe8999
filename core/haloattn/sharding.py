"""DTensor inputs: tensor parallelism over heads, data parallelism over the batch.

A call is independent per batch element and per head, so each rank runs the call on its own
shard through any backend, and autograd runs through the local call. Per mesh dimension the
query's placement picks how: sharded over its heads axis, every input is sharded over heads (the
per-head tables ``rpb`` and ``kq_conv`` over their first axis) and so are the outputs; sharded
over the batch, the token tensors are sharded over the batch and the tables replicated (their
gradients partial sums, which DTensor reduces where they are used); otherwise (replicated, or
sharded over the grid) every input is replicated. Inputs placed otherwise are redistributed
first. Grouped-query heads shard only where the mesh dimension's size divides the key/value heads
(then every rank's query heads find their key/value head on the same rank); anything else
raises before a rank runs. torch.distributed.tensor is imported on the first DTensor call, not
on ``import haloattn``.
"""

from __future__ import annotations

import functools
from typing import Callable, List, Optional, Sequence, Tuple

import torch

from .problem import mods_on_indices

HEADS, BATCH, REPLICATE = "heads", "batch", "replicate"
# Position of each tensor argument's kind: query, key, value, rpb, kq_conv, additional_keys,
# additional_values.
_ROLES = ("tokens", "tokens", "tokens", "table", "table", "additional", "additional")


def is_dtensor(t) -> bool:
    return type(t).__module__.startswith("torch.distributed.tensor")


def split_by(query) -> List[str]:
    """Per mesh dimension, how the call splits: over heads, over the batch, or not at all."""
    from torch.distributed.tensor import Shard

    heads_axis = query.ndim - 2
    kinds = []
    for placement in query.placements:
        if isinstance(placement, Shard) and placement.dim % query.ndim == heads_axis:
            kinds.append(HEADS)
        elif isinstance(placement, Shard) and placement.dim % query.ndim == 0:
            kinds.append(BATCH)
        else:
            kinds.append(REPLICATE)
    return kinds


def check(tensors: Sequence, kinds: Sequence[str]) -> None:
    """Every tensor argument a DTensor on the query's mesh, and head splits only over mesh
    dimensions whose size divides the key/value heads."""
    query, key = tensors[0], tensors[1]
    names = ("query", "key", "value", "rpb", "kq_conv", "additional_keys", "additional_values")
    for name, t in zip(names, tensors):
        if t is not None and not is_dtensor(t):
            raise TypeError(f"{name} is a {type(t).__name__} while query is a DTensor; allowed: DTensors on one "
                            "device mesh for every tensor argument")
        if t is not None and t.device_mesh != query.device_mesh:
            raise ValueError(f"{name} is on device mesh {t.device_mesh}, query on {query.device_mesh}; allowed: one "
                             "device mesh")
    kv_heads = key.shape[-2]
    for mesh_dim, kind in enumerate(kinds):
        ranks = query.device_mesh.size(mesh_dim)
        if kind == HEADS and kv_heads % ranks:
            raise ValueError(
                f"query is sharded over its heads on mesh dimension {mesh_dim} of size {ranks}, which does not "
                f"divide the {kv_heads} key/value heads; allowed: head sharding over a mesh dimension whose size "
                f"divides the key/value heads (or shard the batch, or replicate)")


def _placement(kind: str, role: str, ndim: int, gradient: bool = False):
    """Where a tensor of this role lies (or, with ``gradient``, its gradient) for a split."""
    from torch.distributed.tensor import Partial, Replicate, Shard

    if kind == HEADS:
        return Shard({"tokens": ndim - 2, "table": 0, "additional": 2}[role])
    if kind == BATCH:
        if role == "table":
            return Partial() if gradient else Replicate()
        return Shard(0)
    return Replicate()


def attention(tensors: Sequence, call: Callable, return_lse: bool):
    """``call`` (haloattn.attention on plain tensors) run on each rank's shards of DTensor
    ``tensors``; the output (and LSE) as DTensors."""
    from torch.distributed.tensor import DTensor

    query = tensors[0]
    kinds = split_by(query)
    check(tensors, kinds)
    mesh = query.device_mesh
    local = []
    for t, role in zip(tensors, _ROLES):
        if t is None:
            local.append(None)
            continue
        placements = [_placement(kind, role, t.ndim) for kind in kinds]
        grads = [_placement(kind, role, t.ndim, gradient=True) for kind in kinds]
        local.append(t.redistribute(mesh, placements).to_local(grad_placements=grads))
    batch_offset, head_offset = _first_index(query.shape, mesh, [_placement(kind, "tokens", query.ndim) for kind in kinds],
                                             (0, query.ndim - 2))
    out, lse = call(*local, mods=functools.partial(shifted_mods, batch_offset=batch_offset, head_offset=head_offset))
    value = tensors[2]
    out_shape = (*query.shape[:-1], value.shape[-1])
    out = DTensor.from_local(out, mesh, [_placement(kind, "tokens", len(out_shape)) for kind in kinds],
                             run_check=False, shape=torch.Size(out_shape), stride=_contiguous(out_shape))
    if not return_lse:
        return out
    lse_shape = tuple(query.shape[:-1])
    # The LSE's heads are its last axis, which _placement's "tokens" (ndim - 2 of a tensor with a
    # channel axis) names for the output it belongs to.
    lse = DTensor.from_local(lse, mesh, [_placement(kind, "tokens", len(lse_shape) + 1) for kind in kinds],
                             run_check=False, shape=torch.Size(lse_shape), stride=_contiguous(lse_shape))
    return out, lse


def _first_index(shape, mesh, placements, dims) -> Tuple[int, ...]:
    """This rank's first global index along each of ``dims`` of a tensor of global ``shape`` so
    placed: DTensor's Shard splits an axis as torch.chunk does (ceil-sized chunks, the last ones
    short or empty), mesh dimensions in order, each splitting what the ones before left."""
    from torch.distributed.tensor import Shard

    length, first = list(shape), [0] * len(shape)
    coordinate = mesh.get_coordinate()
    for mesh_dim, placement in enumerate(placements):
        if isinstance(placement, Shard):
            d = placement.dim % len(shape)
            chunk = -(-length[d] // mesh.size(mesh_dim))
            start = min(coordinate[mesh_dim] * chunk, length[d])
            first[d] += start
            length[d] = min(chunk, length[d] - start)
    return tuple(first[d] for d in dims)


@functools.lru_cache(maxsize=256)
def shifted_mods(score_mod: Optional[Callable], mask_mod: Optional[Callable], batch_offset: int,
                 head_offset: int) -> Tuple[Optional[Callable], Optional[Callable]]:
    """The mods as one rank's shard must call them: its local batch and head indices shifted to
    the global ones the user's functions expect (a per-head ALiBi slope read with ``h``, a mask
    that depends on ``b``), which the unshifted local indices silently got wrong on every rank but
    the first. Cached, so that a rank's calls keep one function (haloattn's call and plan caches
    are keyed on it)."""
    if batch_offset == 0 and head_offset == 0:
        return score_mod, mask_mod
    return mods_on_indices(score_mod, mask_mod, lambda b, h: (b + batch_offset, h + head_offset))


def _contiguous(shape) -> tuple:
    strides, step = [], 1
    for extent in reversed(shape):
        strides.append(step)
        step *= extent
    return tuple(reversed(strides))
