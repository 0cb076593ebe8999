"""Copy csrc/ into ab_<name>/csrc with one part of the Hopper kernels' work taken out, for
gpu_ab_interleaved.sh to time beside the working tree: what that part costs. The copies compute
wrong answers by design; time them only (the A/B script's smoke run and tests use the working
tree's build).

    python benchmarks/make_ablation_tree.py nomask
    AB_BASES=ab_nomask SPLIT_PROBLEMS=0,1,5,9 TRITON=1 bash benchmarks/gpu_ab_interleaved.sh

Ablations:
  nomask  every key tile taken as unmasked (forward and backward): the masks' cost, building and
          applying them (RESULTS.md, "Where the Hopper kernels' time does not go", 2026-12-02).
"""

from __future__ import annotations

import argparse
import os
import shutil

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Per ablation: (file under csrc/, the line as it stands, its replacement).
ABLATIONS = {
    "nomask": [
        ("neighborhood_forward_sm90.cu",
         "      TileMask m{kMaskEveryTile || !tile_in(cursor, own.full_lo, own.full_hi), 0, 0};",
         "      TileMask m{false, 0, 0};"),
        ("neighborhood_backward_sm90.cu",
         "        if (kMaskEveryTile || !tile_in(cursor, mine.full_lo, mine.full_hi)) {",
         "        if (false) {"),
    ],
}


def write_ablation(name: str, target: str) -> None:
    """csrc/ copied to ``target`` with ablation ``name`` applied; an error where csrc/ no longer
    has a line to replace exactly once."""
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(os.path.join(ROOT, "csrc"), target)
    for file, old, new in ABLATIONS[name]:
        path = os.path.join(target, file)
        text = open(path).read()
        if text.count(old) != 1:
            raise ValueError(f"{file}: the line to replace is no longer there once: {old.strip()}")
        with open(path, "w") as f:
            f.write(text.replace(old, new))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("name", choices=sorted(ABLATIONS))
    args = parser.parse_args()
    target = os.path.join(ROOT, f"ab_{args.name}", "csrc")
    write_ablation(args.name, target)
    print(f"wrote {target}")


if __name__ == "__main__":
    main()
