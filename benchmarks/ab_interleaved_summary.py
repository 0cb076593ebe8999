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


Times = Dict[str, Dict[str, List[float]]]  # problem -> part -> ms, one entry per round


def split_times(row: dict) -> Dict[str, float]:
    """A kernel_split.py row: each pass's kernels summed."""
    return {part: sum(row[part].values()) for part in ("forward", "backward") if row.get(part)}


def bench_times(row: dict) -> Dict[str, float]:
    """A bench_cuda.py row: the cuda backend's do_bench times."""
    if "cuda_fwd_ms" not in row:
        return {}
    return {"forward": row["cuda_fwd_ms"], "forward+backward": row["cuda_fwdbwd_ms"]}


def load_rounds(out_dir: str, prefix: str, tree: str, times_of) -> Times:
    """Every round's file PREFIX_TREE_*.json of one tree, read row by row with ``times_of``."""
    times: Times = {}
    for path in sorted(glob.glob(os.path.join(out_dir, f"{prefix}_{tree}_*.json"))):
        with open(path) as f:
            for row in json.load(f):
                entry = times.setdefault(row["problem"], {})
                for part, ms in times_of(row).items():
                    entry.setdefault(part, []).append(ms)
    return times


def print_table(title: str, per_tree: Dict[str, Times], trees: List[str]) -> None:
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
    split = {tree: load_rounds(out_dir, "split", tree, split_times) for tree in trees}
    print_table("device time (kernel_split)", split, trees)
    bench = {tree: load_rounds(out_dir, "bench", tree, bench_times) for tree in trees}
    if any(bench[tree] for tree in trees):
        print_table("do_bench time (bench_cuda)", bench, trees)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
