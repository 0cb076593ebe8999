"""Which head dims the flex backend's compiled Flex kernels take on this GPU: forward and backward
of a small 2-D problem with a score_mod per (dtype, D, D_v), checked against the float64 reference.
Its findings set plugin.MIN_HEAD_DIM / MAX_FLOAT32_HEAD_DIM. Each new dim compiles (~20 s).

    python benchmarks/probe_flex_head_dims.py
"""

import sys
from pathlib import Path

import torch

import haloattn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import oracle  # noqa: E402

DIMS = ((8, 8), (24, 24), (48, 48), (80, 80), (96, 64), (160, 160), (192, 192), (256, 256), (320, 320),
        (512, 512), (64, 512))


def distance(score, b, h, q_idx, kv_idx):
    return score - 0.01 * (q_idx - kv_idx).abs()


def probe(dtype, D, Dv):
    q = torch.randn(1, 20, 20, 2, D, device="cuda", dtype=dtype, requires_grad=True)
    k = torch.randn_like(q, requires_grad=True)
    v = torch.randn(1, 20, 20, 2, Dv, device="cuda", dtype=dtype, requires_grad=True)
    out = haloattn.attention(q, k, v, 7, score_mod=distance, backend="flex")
    torch.autograd.grad(out.sum(), (q, k, v))
    ref = haloattn.attention(q.double(), k.double(), v.double(), 7, score_mod=distance, backend="reference")
    return f"ok, rel error {oracle.rel_error(out, ref):.1e}"


def main():
    for dtype in (torch.bfloat16, torch.float32):
        for D, Dv in DIMS:
            try:
                verdict = probe(dtype, D, Dv)
            except Exception as exc:  # the probe's purpose: report what fails and why
                verdict = "FAIL " + " ".join(f"{type(exc).__name__}: {exc}".split())[:150]
            print(f"{str(dtype).replace('torch.', '')} D={D} D_v={Dv}: {verdict}", flush=True)


if __name__ == "__main__":
    main()
