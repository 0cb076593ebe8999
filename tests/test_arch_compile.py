"""The Triton kernels compile for the GPU generations other than Hopper, on a machine without a GPU.

The backend runs on every NVIDIA GPU Triton supports (compute capability 8.0 and up), but its
configs were tuned on sm_90, whose 227 KiB of shared memory a block no consumer GPU has, and its
kernels take other code paths elsewhere (mma.sync on Ampere, Ada and consumer Blackwell, tcgen05 on
the B200, no TMA before Hopper). Here the launchers pick their configs under each target's device
limits (benchmarks/sm90_compile.py: GPUS, captured_launches) and every captured kernel (forward,
backward and the forward-mode JVP) is built for that target with the ptxas Triton bundles for it,
as the JIT would build it there; it must fit the target's registers and shared memory a block.
The cases and the child-process runner are tests/test_sm90_compile.py's.

Targets: sm_80 (A100: 163 KiB), sm_89 (RTX 4090, L4, L40: 99 KiB; sm_86, RTX 30xx, has the same
limit and the same mma.sync code path; every case built and fitted for it too when tried), sm_100 (B200:
227 KiB, tcgen05) and sm_120 (RTX 50xx: 99 KiB). Triton 3.6's bundled ptxas (CUDA 12.8, and 12.9
for sm_100 and up) builds all of them; none is left out.
"""

from __future__ import annotations

import pytest

import test_sm90_compile
from test_sm90_compile import CASES, GPUS, check_kernels_run, compile_in_child, launch

# The same skip: without Triton's bundled ptxas nothing can be built.
pytestmark = test_sm90_compile.pytestmark

TARGETS = (80, 89, 100, 120)
# One case per feature family of the sm_90 test, kept few for CI time (four targets).
ARCH_CASES = (
    "neighbourhood_2d_rpb_softcap",
    "neighbourhood_1d_causal_strided_dilated_gqa",
    "neighbourhood_3d_window_shift_extra_keys",
    "neighbourhood_2d_causal_hd192_dv64",
    "neighbourhood_2d_split_heads_hd160_dv80",
    "neighbourhood_2d_narrow_small_tiles",
    "neighbourhood_3d_float32_hd16_causal_rpb",
    "neighbourhood_2d_small_window_hd256_rpb",
    "neighbourhood_3d_wide_hd256_four_warps",
    "neighbourhood_3d_key_major_boxes_hd64",
    "window_swin_shift_rpb",
    "window_12x12_long",
    "window_8x8_float32_hd64",
)


@pytest.fixture(scope="module", params=TARGETS, ids=lambda capability: f"sm{capability}")
def compiled_for_target(request):
    """The cases compiled for one target (in a child process: compile_in_child), and its GPU."""
    capability = request.param
    return (*compile_in_child(capability, ARCH_CASES), GPUS[capability])


@pytest.mark.parametrize("name", ARCH_CASES)
def test_kernels_compile_for_target(name, compiled_for_target):
    results, log, gpu = compiled_for_target
    check_kernels_run(name, results, log, gpu)


@pytest.mark.parametrize("name", [name for name in ARCH_CASES if CASES[name][0] is launch])
def test_forward_mode_kernel_is_built(name, compiled_for_target):
    """The JVP kernel is among what each neighbourhood case builds (forward-mode AD runs there)."""
    results, log, gpu = compiled_for_target
    kernels = [row["kernel"] for row in results.get(name, {}).get("kernels", [])]
    assert kernels.count("jvp_kernel") == 1, (gpu.name, name, kernels, log)
