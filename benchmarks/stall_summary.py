"""Where a kernel's warps wait, instruction by instruction, from Nsight Compute's stall sampling.

Reads the SASS page that ``ncu -i REPORT --page source --csv --print-source sass`` writes for a
report taken with ``--section SourceCounters`` (``profile_kernels.sh`` with ``SAMPLING=1`` makes
both) and prints the shares of the samples by stall reason, the instructions that hold the most
samples (offset from the kernel's start, share, warp-level executions, SASS) and what the
local-memory (spill) instructions cost. A wait on an mbarrier shows as the branch after its
``SYNCS.PHASECHK`` (long scoreboard); its execution count says whose loop it is (per tile, per pair).

    python benchmarks/stall_summary.py FILE.csv [--top 25] [--by-count 12]

--by-count also groups the samples by how often an instruction ran: in a persistent kernel that
separates the code that runs once per key tile (the most frequent count) from the code that runs
once per pair tile and warp, and so on.
"""

from __future__ import annotations

import argparse
import collections
import csv

ALL = "Warp Stall Sampling (All Samples)"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--by-count", type=int, default=0, metavar="N",
                        help="the N execution counts holding the most samples, with their instructions and reasons")
    args = parser.parse_args()
    with open(args.csv, newline="") as f:
        rows = list(csv.reader(f))
    # Row 0 names the kernel, row 1 the columns; then one row per SASS instruction.
    print(" ".join(rows[0])[:200])
    header, data = rows[1], rows[2:]
    column = {name: i for i, name in enumerate(header)}

    def value(row, name):
        return float(row[column[name]] or 0)

    total = sum(value(r, ALL) for r in data)
    reasons = collections.Counter()
    for r in data:
        for name in header:
            if name.startswith("stall_") and "Not Issued" not in name:
                reasons[name[len("stall_"):]] += value(r, name)
    print(f"{int(total)} samples; by reason: " +
          ", ".join(f"{k} {v / total * 100:.1f}%" for k, v in reasons.most_common(10)))
    start = int(data[0][0], 16)
    for r in sorted(data, key=lambda r: -value(r, ALL))[:args.top]:
        print(f"  {int(r[0], 16) - start:#07x} {value(r, ALL) / total * 100:5.2f}%"
              f" exec={int(value(r, 'Instructions Executed')):>9} {r[column['Source']].strip()[:90]}")
    if args.by_count:
        print_by_count(data, header, value, total, args.by_count)
    local = [r for r in data if "LDL" in r[column["Source"]] or "STL" in r[column["Source"]]]
    print(f"local loads/stores: {len(local)} instructions, "
          f"{int(sum(value(r, 'Instructions Executed') for r in local))} executions, "
          f"{sum(value(r, ALL) for r in local) / total * 100:.1f}% of samples")


def print_by_count(data, header, value, total, limit):
    samples, instructions = collections.Counter(), collections.Counter()
    reasons = collections.defaultdict(collections.Counter)
    for r in data:
        count = int(value(r, "Instructions Executed"))
        samples[count] += value(r, ALL)
        instructions[count] += 1
        for name in header:
            if name.startswith("stall_") and "Not Issued" not in name:
                reasons[count][name[len("stall_"):]] += value(r, name)
    print("by execution count (instructions that ran that often, their share of the samples, top reasons):")
    for count, share in samples.most_common(limit):
        top = ", ".join(f"{k} {v / share * 100:.0f}%" for k, v in reasons[count].most_common(4))
        print(f"  exec={count:>9} instructions={instructions[count]:>5} samples={share / total * 100:5.1f}%  {top}")


if __name__ == "__main__":
    main()
