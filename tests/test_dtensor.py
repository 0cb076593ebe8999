"""DTensor inputs on two CPU ranks (gloo): sharded over heads, over the batch (unevenly),
replicated, or over the grid (redistributed), the output, LSE and every gradient equal the
single-process call's; grouped-query heads over a mesh that does not divide them, and a plain
tensor beside DTensors, raise before anything runs."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import haloattn

pytestmark = pytest.mark.usefixtures("plain_cpu_environment")

WORLD = 2


def _inputs():
    g = torch.Generator().manual_seed(11)
    make = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    # 4 query heads over 2 key/value heads (GQA), batch 3 (uneven over two ranks), rpb and
    # additional tokens to shard with them.
    return dict(q=make(3, 6, 7, 4, 8), k=make(3, 6, 7, 2, 8), v=make(3, 6, 7, 2, 12), rpb=make(4, 5, 5),
                ak=make(3, 2, 2, 8), av=make(3, 2, 2, 12))


def _call(**tensors):
    return haloattn.attention(tensors["q"], tensors["k"], tensors["v"], (3, 3), dilation=(1, 2), rpb=tensors["rpb"],
                              additional_keys=tensors["ak"], additional_values=tensors["av"], return_lse=True)


def _loss(out, lse):
    return (out ** 2).sum() + lse.sum()


def _ranks(rank, init_file, results):
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor, init_device_mesh

    os.environ.pop("TRITON_INTERPRET", None)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        mesh = init_device_mesh("cpu", (WORLD,))
        plain = {name: t.requires_grad_() for name, t in _inputs().items()}
        out, lse = _call(**plain)
        expected = [out, lse, *torch.autograd.grad(_loss(out, lse), list(plain.values()))]
        errors = {}
        for label, placement in (("heads", Shard(3)), ("batch", Shard(0)), ("replicated", Replicate()),
                                 ("grid", Shard(1))):
            tokens = {"q", "k", "v"}
            sharded = {name: distribute_tensor(t.detach(), mesh, [placement if name in tokens else Replicate()])
                       .requires_grad_() for name, t in plain.items()}
            out, lse = _call(**sharded)
            got = [out, lse, *torch.autograd.grad(_loss(out, lse), list(sharded.values()))]
            errors[label] = [(g.full_tensor() - e).abs().max().item() for g, e in zip(got, expected)]
            errors[label + " placements"] = [str(out.placements), str(lse.placements)]
        # Errors raised before any rank runs.
        k3 = distribute_tensor(_inputs()["k"][..., :1, :].expand(3, 6, 7, 3, 8).contiguous(), mesh, [Shard(3)])
        q6 = distribute_tensor(torch.randn(3, 6, 7, 6, 8, dtype=torch.float64), mesh, [Shard(3)])
        for label, call in (("gqa", lambda: haloattn.attention(q6, k3, k3, 3)),
                            ("mixed", lambda: haloattn.attention(q6, k3.full_tensor(), k3, 3))):
            try:
                call()
                errors[label] = "no error"
            except (ValueError, TypeError) as exc:
                errors[label] = str(exc)
        results[rank] = errors
    finally:
        dist.destroy_process_group()


def test_dtensor_shards_match_the_single_process_call(tmp_path):
    results = mp.Manager().dict()
    mp.spawn(_ranks, args=(str(tmp_path / "init"), results), nprocs=WORLD, join=True)
    for rank in range(WORLD):
        errors = results[rank]
        for label in ("heads", "batch", "replicated", "grid"):
            # out, lse, then the gradients of q, k, v, rpb, additional keys and values
            assert max(errors[label]) < 1e-12, (rank, label, errors[label])
        assert errors["heads placements"] == ["(Shard(dim=3),)", "(Shard(dim=3),)"]
        assert errors["batch placements"] == ["(Shard(dim=0),)", "(Shard(dim=0),)"]
        assert errors["grid placements"] == ["(Replicate(),)", "(Replicate(),)"]
        assert "does not divide the 3 key/value heads" in errors["gqa"], errors["gqa"]
        assert "key is a Tensor while query is a DTensor" in errors["mixed"], errors["mixed"]
