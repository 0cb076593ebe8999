"""Long-window kernels of backend ``triton_window`` (window_long_kernels.py: windows cut into
parts) on CPU through Triton's interpreter, against the float64 oracle: forward, LSE and every
gradient (query, key, value, rpb, through grad_lse too).

Real long windows (129-256 tokens) are too slow for the interpreter, so the tests shrink the limits:
SQUARE_TILE_MAX = 16 sends every window over 16 (padded) tokens to the long kernels, and a small
MAX_PART cuts tiny windows into 2, 3 and 4 parts, of equal and of mixed sizes."""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from test_triton_window import check_against_oracle  # noqa: E402

pytest.importorskip("triton")

from haloattn.backends.triton import fast_launch, window_launch, window_long_launch  # noqa: E402
from haloattn.backends.triton.window_long_launch import parts  # noqa: E402
from haloattn.problem import build_problem  # noqa: E402


@pytest.fixture
def long_kernels(monkeypatch):
    """Every window over 16 padded tokens runs the long kernels, cut into parts of at most 16 slots
    (a test may lower or raise that through the returned setter)."""
    monkeypatch.setattr(window_launch, "SQUARE_TILE_MAX", 16)
    monkeypatch.setattr(window_long_launch, "MAX_PART", 16)
    return lambda size: monkeypatch.setattr(window_long_launch, "MAX_PART", size)


def test_parts_of_real_windows():
    assert parts(144) == (64, 64, 16, 0)  # Swin V2 / Swin-B 384 12x12, Video Swin 4x6x6
    assert parts(196) == (64, 64, 64, 16)  # 14x14: 208 slots
    assert parts(200) == (64, 64, 64, 16)  # 2x10x10
    assert parts(256) == (64, 64, 64, 64)  # 16x16
    assert parts(129) == (64, 64, 16, 0)
    # 240 slots would need five parts of at most 64: padded to four full ones instead.
    assert parts(240) == (64, 64, 64, 64)
    assert parts(225) == (64, 64, 64, 64)  # 15x15
    # Five parts of 16 even when rounded to 16s: the largest part doubles.
    assert parts(80, 16) == (32, 32, 16, 0)
    assert parts(20, 16) == (16, 16, 0, 0)
    assert parts(80, 32) == (32, 32, 16, 0)
    with pytest.raises(ValueError, match="max_part must be a power of two of at least 16, got 24"):
        parts(100, 24)
    # float32 problems take parts of at least 32 slots (MIN_PART_FLOAT32: Triton 3.6 miscompiled
    # 16-slot float32 parts on Hopper).
    assert parts(143, min_part=32) == (64, 64, 32, 0)
    assert parts(203, min_part=32) == (64, 64, 64, 32)
    assert parts(129, min_part=32) == (64, 64, 32, 0)
    with pytest.raises(ValueError, match="volume must be at least 1 token, got 0"):
        parts(0)


def test_float32_channel_tiles_are_at_least_32_wide():
    # MIN_CHANNELS_FLOAT32: Triton 3.6 miscompiled the long-window dQ kernel's 16-channel float32
    # tiles on Hopper (an illegal address); 16-bit problems keep 16-channel tiles.
    def channel_tiles(dtype, head_dim, value_dim):
        q = torch.empty(1, 700, 3, head_dim, dtype=dtype)
        v = torch.empty(1, 700, 3, value_dim, dtype=dtype)
        launch = window_launch.plan(build_problem(q, q, v, 253, pattern="window"))
        return launch.block_d, launch.block_dv

    assert channel_tiles(torch.float32, 16, 32) == (32, 32)
    assert channel_tiles(torch.float32, 8, 48) == (32, 64)
    assert channel_tiles(torch.bfloat16, 16, 32) == (16, 32)
    assert channel_tiles(torch.float16, 8, 16) == (16, 16)


def test_long_windows_take_the_long_kernels(monkeypatch):
    launched = []
    original = fast_launch.resolve

    def recording(fn):
        launched.append(fn.__name__)
        return original(fn)

    monkeypatch.setattr(fast_launch, "resolve", recording)
    monkeypatch.setattr(window_launch, "SQUARE_TILE_MAX", 16)
    check_against_oracle((6, 5), (4, 5), shift=(2, 3), heads=1)
    assert launched == ["window_long_forward_kernel", "window_long_dq_kernel", "window_long_dkdv_kernel"]


def test_two_parts_shift_partial_edges(long_kernels):
    check_against_oracle((8, 9), (4, 5), shift=(2, 3), batch=2)  # 20 tokens: 16 + 16


def test_three_parts_dilation(long_kernels):
    check_against_oracle((10, 7), (5, 7), dilation=(2, 1), shift=(1, 2))  # 35 tokens: 16 x 3


def test_three_parts_causal_axis(long_kernels):
    check_against_oracle((6, 6), (6, 6), causal=(True, False), shift=(0, 3))  # 36 tokens: 16 x 3


def test_four_parts(long_kernels):
    check_against_oracle((7, 7), 7, shift=3)  # 49 tokens: 16 x 4


def test_mixed_part_sizes_3d(long_kernels):
    long_kernels(32)
    check_against_oracle((4, 5, 4), (4, 5, 4), shift=(0, 2, 1))  # 80 tokens: 32 + 32 + 16


def test_mixed_part_sizes_gqa_value_dim_softcap(long_kernels):
    long_kernels(32)
    check_against_oracle((6, 8), (6, 8), heads=4, kv_heads=2, head_dim=16, value_dim=32, shift=(3, 0),
                         softcap=1.5, scale=0.7)  # 48 tokens: 32 + 16


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision(long_kernels, dtype):
    check_against_oracle((6, 7), (4, 5), dtype=dtype, shift=(1, 2))


def test_packed_qkv_head_dim_30(long_kernels):
    check_against_oracle((6, 5), (4, 5), packed=True, head_dim=30, shift=(2, 0), batch=2)


def test_without_rpb_or_lse_gradient(long_kernels):
    check_against_oracle((6, 5), (4, 5), shift=(2, 2), rpb=False, grad_lse=False)


def test_float32_windows_get_parts_of_at_least_32_slots():
    """A 143-token window (11x13) in float32 runs as 64 + 64 + 32 slots, in 16-bit types as
    64 + 64 + 16: 16-slot float32 parts read shared memory past their buffers on Hopper."""
    from haloattn.problem import build_problem

    for dtype, last in ((torch.float32, 32), (torch.bfloat16, 16)):
        q = torch.empty(1, 22, 26, 2, 32, dtype=dtype)
        problem = build_problem(q, q, q, (11, 13), pattern="window")
        assert window_long_launch._problem_parts(problem) == (64, 64, last, 0), dtype
