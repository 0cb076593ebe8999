"""The tiny random problems of tests/tiny_random.py, compiled, through backend ``triton`` on a
CUDA GPU against the float64 oracle, in each dtype, with head and value dims around the kernels'
block-and-tail split (tiles.head_split). The CPU tests run such problems under Triton's
interpreter; compiled, the same seeds found two miscompiles the interpreter cannot show (float32's
three-part products on a split head, bfloat16 with a value tail the head does not fill; RESULTS.md
"Random problems through the compiled kernels"). Run with ``pytest -m gpu``;
``HALOATTN_TINY_SEEDS="start:stop"`` runs other seeds.
"""

import os

import pytest
import torch

from tiny_random import DTYPES, check

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

HEAD_DIMS = (48, 72, 80, 144, 160)
SEEDS_ENV = "HALOATTN_TINY_SEEDS"


def seeds():
    start, _, stop = os.environ.get(SEEDS_ENV, "9000:9100").partition(":")
    return range(int(start), int(stop))


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("seed", seeds())
def test_tiny_random_problem_compiled(dtype, seed):
    verdict = check(seed, "triton", HEAD_DIMS, "cuda", DTYPES[dtype])
    assert verdict == "OK" or verdict.startswith("REFUSED"), verdict


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("seed", range(9500, 9530))
def test_tiny_random_key_query_convolution_compiled(dtype, seed):
    """Rank-1 problems with a key-query convolution (triton's kq_conv kernels), the kernel's
    gradient checked too."""
    verdict = check(seed, "triton", (16, 32, 64), "cuda", DTYPES[dtype], kq_conv=True)
    assert verdict == "OK", verdict


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("seed", range(9600, 9630))
def test_tiny_random_problems_with_mods_compiled(dtype, seed):
    """Problems with a score_mod and / or mask_mod (tiny_random.SCORE_MODS / MASK_MODS), which
    backend triton compiles into its kernels."""
    verdict = check(seed, "triton", (16, 32, 64), "cuda", DTYPES[dtype], mods=True)
    assert verdict == "OK", verdict
