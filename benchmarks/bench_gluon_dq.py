"""The Gluon dQ pass (gluon_dq_kernel.py) against the Triton dQ kernel of the default config.

Per problem (bench_gluon_dkdv.py's: the issue's rows but dilation, off-list ones at 128 and 64
channels): the backward's median time (every gradient; ``do_bench``) with the default config's dQ
part named Gluon and named Triton, their ratio, and the relative difference of the gradients
(dK and dV too: the dK/dV pass reads the statistics rows the dQ pass writes).

    python benchmarks/bench_gluon_dq.py [--only 0,2] [--json FILE]
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_gluon_dkdv import compare_pass  # noqa: E402

from haloattn.backends.triton import tiles  # noqa: E402

if __name__ == "__main__":
    compare_pass("dq", lambda problem, _part: tiles.gluon_dq_problem(problem), __doc__.splitlines()[0])
