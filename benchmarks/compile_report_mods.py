"""Build the neighbourhood kernels for sm_90 (no GPU) with and without score_mod / mask_mod and
report what the compiler made (registers, spills, shared memory, SASS counts; sm90_compile.py
says how): the cost of the mods' hooks in each kernel, side by side.

The problem is tests/test_sm90_compile.py's case ``neighbourhood_2d_mods_rpb_softcap_extra_keys``
(2-D 16x16, window 5, bf16, H=4/2, D=64, rpb, softcap, 3 additional tokens; a score_mod reading a
captured [4, 64] table per pair, and a mask_mod), built four ways: no mods, the score_mod only,
the mask_mod only, both.

    python benchmarks/compile_report_mods.py
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))

import test_sm90_compile as cases  # noqa: E402

CASE = "neighbourhood_2d_mods_rpb_softcap_extra_keys"


def main() -> None:
    launcher, *spec, options = cases.CASES[CASE]
    variants = {
        "without_mods": {k: v for k, v in options.items() if k not in ("score_mod", "mask_mod")},
        "score_mod_only": {k: v for k, v in options.items() if k != "mask_mod"},
        "mask_mod_only": {k: v for k, v in options.items() if k != "score_mod"},
    }
    for name, variant in variants.items():
        cases.CASES[name] = (launcher, *spec, variant)
    cases._main([*variants, CASE])  # prints one line per kernel (sm90_compile), then RESULT lines


if __name__ == "__main__":
    main()
