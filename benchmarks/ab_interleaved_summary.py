"""Summary of gpu_ab_interleaved.sh: per problem, each tree's median forward and backward device
time over the rounds (and, where the rounds ran bench_cuda.py, its do_bench forward and
forward+backward times), the spread of its rounds, and its ratio to the first tree (above 1: the
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


def load_bench_rounds(out_dir: str, tree: str) -> Dict[str, Dict[str, List[float]]]:
    """problem -> {"forward": [do_bench ms per round], "forward+backward": [...]} for one tree."""
    times: Dict[str, Dict[str, List[float]]] = {}
    for path in sorted(glob.glob(os.path.join(out_dir, f"bench_{tree}_*.json"))):
        with open(path) as f:
            for row in json.load(f):
                entry = times.setdefault(row["problem"], {"forward": [], "forward+backward": []})
                if "cuda_fwd_ms" in row:
                    entry["forward"].append(row["cuda_fwd_ms"])
                    entry["forward+backward"].append(row["cuda_fwdbwd_ms"])
    return times


def print_table(title: str, per_tree: Dict[str, Dict[str, Dict[str, List[float]]]], trees: List[str]) -> None:
    first = trees[0]
    print(f"{title}: median ms over rounds (min-max); ratio = tree's time / {first}'s")
    for problem, parts in per_tree[first].items():
        for part, base in parts.items():
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


def main(argv: List[str]) -> int:
    if len(argv) < 3:
        print(__doc__)
        return 2
    out_dir, trees = argv[1], argv[2:]
    print_table("device time (kernel_split)", {tree: load_rounds(out_dir, tree) for tree in trees}, trees)
    bench = {tree: load_bench_rounds(out_dir, tree) for tree in trees}
    if any(bench[tree] for tree in trees):
        print_table("do_bench time (bench_cuda)", bench, trees)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
