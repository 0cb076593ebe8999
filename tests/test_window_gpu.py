"""Backend ``triton_window`` compiled on a CUDA GPU, against the float64 oracle: Swin, SwinIR,
Swin V2, Video Swin and MaxViT shapes, every dtype, forward, LSE and all gradients; and no
recompilation when only batch or grid size changes."""

import pytest
import torch

import haloattn
from test_triton_window import check_against_oracle

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
CASES = {
    # name: (spatial, window, dtype, options); one dtype per shape keeps the compile count low.
    "swin_7x7": ((14, 14), 7, F16, dict(shift=0)),
    "swin_7x7_shift3_f32": ((14, 21), 7, F32, dict(shift=3)),
    "swin_7x7_shift3_f16": ((14, 21), 7, F16, dict(shift=3)),
    "swin_7x7_shift3_bf16": ((14, 21), 7, BF16, dict(shift=3)),
    "swinir_8x8_hd30": ((16, 16), 8, F16, dict(shift=4, head_dim=30)),
    "ragged_grid_partial_windows": ((13, 11), (7, 5), F32, dict(shift=(3, 2))),
    "swinv2_12x12": ((24, 12), 12, BF16, dict(shift=6)),
    "swinv2_16x16": ((16, 32), 16, F16, dict(shift=8)),
    "maxvit_grid": ((14, 14), 7, BF16, dict(dilation=2)),
    "causal_time_3d": ((4, 8, 8), (2, 4, 4), F32, dict(causal=(True, False, False), shift=(0, 2, 2))),
    "video_4x7x7": ((8, 7, 14), (4, 7, 7), F16, dict(shift=(2, 3, 3))),
    "gqa_hd64": ((8, 8), 4, BF16, dict(heads=4, kv_heads=2, head_dim=64, shift=2)),
    "hd128_softcap": ((8, 8), 4, F16, dict(head_dim=128, shift=1, softcap=5.0)),
    # Long windows (window_long_kernels.py: parts of 64 + 64 + 16 for 144 tokens, 4 x 64 for 256).
    "long_12x12_shift6_f16": ((24, 36), 12, F16, dict(shift=6, head_dim=32)),
    "long_16x16_bf16": ((32, 16), 16, BF16, dict(shift=8, head_dim=32)),
    "long_video_4x6x6_f32": ((8, 12, 6), (4, 6, 6), F32, dict(shift=(2, 3, 0))),
    "long_15x15_hd128_f16": ((30, 15), 15, F16, dict(shift=7, head_dim=128)),  # 225 -> 4 x 64
    "long_10x14_gqa_hd64": ((20, 28), (10, 14), BF16, dict(heads=4, kv_heads=2, head_dim=64, shift=(5, 7))),
    # float32 head dim 16 (random GPU test seed 2117: 16-channel float32 tiles miscompiled).
    "long_1d_253_hd16_f32": ((700,), 253, F32, dict(value_dim=32)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_against_oracle(name):
    spatial, window, dtype, options = CASES[name]
    options = dict(options)
    heads = options.pop("heads", 2)
    check_against_oracle(spatial, window, dtype=dtype, heads=heads, batch=2, device="cuda", **options)


def test_swin_stage1_shape_packed_qkv():
    check_against_oracle((14, 14), 7, dtype=torch.float16, heads=3, head_dim=32, batch=4, packed=True,
                         shift=3, device="cuda")


def test_window_problems_dispatch_here():
    q = torch.randn(1, 14, 14, 3, 32, device="cuda", dtype=torch.float16)
    assert haloattn.explain(q, q, q, 7, pattern="window", shift=3, verbose=False).chosen == "triton_window"


@pytest.mark.parametrize("window", [7, 12])
def test_no_recompilation_when_batch_or_grid_changes(window):
    from haloattn.backends.triton.window_kernels import window_backward_kernel, window_forward_kernel
    from haloattn.backends.triton.window_long_kernels import (
        window_long_dkdv_kernel, window_long_dq_kernel, window_long_forward_kernel,
    )

    kernels = (window_forward_kernel, window_backward_kernel, window_long_forward_kernel, window_long_dq_kernel,
               window_long_dkdv_kernel)

    def step(batch, height, width):
        x = torch.randn(batch, height, width, 3, 3, 32, device="cuda", dtype=torch.float16, requires_grad=True)
        q, k, v = x.unbind(-3)
        rpb = torch.randn(3, 2 * window - 1, 2 * window - 1, device="cuda", requires_grad=True)
        out = haloattn.attention(q, k, v, window, pattern="window", shift=window // 2, rpb=rpb)
        out.sum().backward()

    def compiled():
        return sum(len(kernel.device_caches[torch.cuda.current_device()][0]) for kernel in kernels)

    step(2, 2 * window, 2 * window)
    before = compiled()
    for batch, height, width in ((3, 2 * window, 2 * window), (1, 3 * window, 4 * window),
                                 (5, 8 * window, 8 * window), (7, 2 * window + 1, window + 2)):
        step(batch, height, width)
    assert compiled() == before


def test_repeated_calls_launch_directly_on_their_own_tensors(monkeypatch):
    """After a problem's first call its launches skip Triton's binder (fast_launch.Launch): later
    calls, forward and backward, short and long windows, must still use their own tensors."""
    from haloattn.backends.triton import fast_launch

    names = ("swin_7x7_shift3_f16", "long_12x12_shift6_f16")

    def run_cases():
        for name in names:
            spatial, window, dtype, options = CASES[name]
            check_against_oracle(spatial, window, dtype=dtype, batch=2, device="cuda", **options)

    run_cases()  # builds the launch plans
    original, resolved = fast_launch.resolve, []
    monkeypatch.setattr(fast_launch, "resolve", lambda fn: resolved.append(fn.__name__) or original(fn))
    run_cases()
    assert resolved == [], "a repeated call went through Triton's binder"


def test_cuda_graphs_of_torch_compile(monkeypatch):
    """``torch.compile(mode="reduce-overhead")`` (CUDA graphs) around window attention with a
    bias table, forward and backward: no tensor the backend caches may be left in the graphs'
    memory pool (its index tables are built outside it), and replays give the eager results."""
    from haloattn.backends.triton import device_constants

    monkeypatch.setattr(device_constants, "_CONSTANTS", {})  # first built inside the compiled region
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 14, 14, 2, 32, generator=gen).to("cuda", torch.float16) for _ in range(3))
    table = (torch.randn(2, 13, 13, generator=gen) * 0.5).cuda().requires_grad_(True)
    grad = torch.randn(2, 14, 14, 2, 32, generator=gen).to("cuda", torch.float16)

    def forward(q, k, v):
        return haloattn.attention(q, k, v, 7, pattern="window", shift=3, rpb=table)

    def run(fn):
        # As a training step does: gradients set to None first (an optimizer's zero_grad), so the
        # table's gradient is the graph's own output, not accumulated into one of an earlier replay.
        torch.compiler.cudagraph_mark_step_begin()
        table.grad = None
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        out = fn(*leaves)
        got = out.detach().clone()
        out.backward(grad)
        return got, leaves[0].grad.clone(), leaves[2].grad.clone(), table.grad.clone()

    compiled = torch.compile(forward, mode="reduce-overhead")
    for _ in range(3):  # warm-up, record, replay
        got = run(compiled)
    want = run(forward)
    for name, g, w in zip(("output", "dq", "dv", "d rpb"), got, want):
        torch.testing.assert_close(g, w, atol=2e-3, rtol=2e-3, msg=lambda m: f"{name}: {m}")
