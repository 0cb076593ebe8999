"""Summary of gpu_ab_interleaved.sh: per problem, each tree's median forward and backward device
time over the rounds, the spread of its rounds, and its ratio to the first tree (above 1: the
first tree is faster).

    python benchmarks/ab_interleaved_summary.py OUT_DIR new main [...]
"""

from __future__ import annotations

import glob
import json
import os
import statistics
import sys
from typing import Dict, List


def load_rounds(out_dir: str, tree: str) -> Dict[str, Dict[str, List[float]]]:
    """problem -> {"forward": [ms per round], "backward": [...]} for one tree."""
    times: Dict[str, Dict[str, List[float]]] = {}
    for path in sorted(glob.glob(os.path.join(out_dir, f"split_{tree}_*.json"))):
        with open(path) as f:
            for row in json.load(f):
                entry = times.setdefault(row["problem"], {"forward": [], "backward": []})
                for part in ("forward", "backward"):
                    if row.get(part):
                        entry[part].append(sum(row[part].values()))
    return times


def main(argv: List[str]) -> int:
    if len(argv) < 3:
        print(__doc__)
        return 2
    out_dir, trees = argv[1], argv[2:]
    per_tree = {tree: load_rounds(out_dir, tree) for tree in trees}
    first = trees[0]
    print(f"median device ms over rounds (min-max); ratio = tree's time / {first}'s")
    for problem in per_tree[first]:
        for part in ("forward", "backward"):
            base = per_tree[first][problem][part]
            if not base:
                continue
            cells = []
            for tree in trees:
                runs = per_tree[tree].get(problem, {}).get(part, [])
                if not runs:
                    cells.append(f"{tree} -")
                    continue
                median = statistics.median(runs)
                ratio = median / statistics.median(base)
                cells.append(f"{tree} {median:.3f} ({min(runs):.3f}-{max(runs):.3f}) x{ratio:.3f}")
            print(f"{problem} | {part} | " + " | ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
