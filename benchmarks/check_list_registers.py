"""GPU check: the forward with its live-step list in registers against loading each entry (and the
reference on the 2-D problem). python3 benchmarks/check_list_registers.py"""
import torch, sys
sys.path.insert(0, "benchmarks")
import haloattn
from unittest import mock
from haloattn.backends.triton import fast_launch, launch
from bench_flex_mods import packed_documents, checker
torch.manual_seed(0)
for spatial, window, mask in (((128, 128), 31, checker), ((32768,), 2047, packed_documents(32768, "cuda"))):
    q, k, v = (torch.randn(1, *spatial, 16, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    a = haloattn.attention(q, k, v, window, backend="triton", mask_mod=mask)
    fast_launch.clear_plans()
    with mock.patch.object(launch, "LIST_IN_REGISTERS", False):
        b = haloattn.attention(q, k, v, window, backend="triton", mask_mod=mask)
    fast_launch.clear_plans()
    r = haloattn.attention(q.float(), k.float(), v.float(), window, backend="reference", mask_mod=mask) if len(spatial) == 2 else b.float()
    print(spatial, "registers vs loads max diff", (a.float() - b.float()).abs().max().item(), "vs reference rel", ((a.float() - r).norm() / r.norm()).item(), flush=True)
