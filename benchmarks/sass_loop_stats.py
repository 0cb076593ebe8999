"""Size and make-up of the cuda backend's Hopper consumer loops, from a disassembly with line info,
without a GPU: per kernel instance, its instructions, and within the span from its first wgmma
(HGMMA) to its last (the consumers' tile loop) the instructions, barrier operations (SYNCS),
branches, reconvergence points (BSSY), local-memory spills (LDL/STL) and shared loads (LDS);
with ``--by-line N`` also the N source lines with the most instructions in that span.

    nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -DHALOATTN_SM90A --expt-relaxed-constexpr \\
        -lineinfo -I<cutlass include> -Icsrc -cubin csrc/neighborhood_forward_sm90.cu -o fwd.cubin
    nvdisasm -g -c fwd.cubin > fwd.sass
    python benchmarks/sass_loop_stats.py fwd.sass [--match nv_bfloat16Li128E] [--by-line 10]
"""

from __future__ import annotations

import argparse
import re
from collections import Counter

INSTRUCTION = re.compile(r"^\s+/\*[0-9a-f]{4,}\*/")
SOURCE = re.compile(r'//## File "([^"]+)", line (\d+)')
COUNTED = {"SYNCS": r"\bSYNCS\b", "BRA": r"\bBRA\b", "BSSY": r"\bBSSY\b", "LDL/STL": r"\b(LDL|STL)\b",
           "LDS": r"\bLDS\b"}


def functions(path: str) -> dict:
    """Each function's instructions, by its mangled name, as (line, source file:line) pairs."""
    found, current, source = {}, None, None
    for line in open(path):
        section = re.match(r"\s*\.section\s+\.text\.([^,\s]+)", line)
        located = SOURCE.search(line)
        if section:
            current, source = found.setdefault(section.group(1), []), None
        elif located:
            source = f"{located.group(1).split('/')[-1]}:{located.group(2)}"
        elif current is not None and INSTRUCTION.search(line):
            current.append((line, source))
    return found


def wgmma_span(instructions: list) -> list:
    wgmma = [i for i, (line, _) in enumerate(instructions) if "HGMMA" in line]
    return instructions[wgmma[0]:wgmma[-1] + 1] if wgmma else []


def loop_stats(instructions: list) -> dict:
    span = wgmma_span(instructions)
    stats = {"total": len(instructions), "span": len(span)}
    for name, pattern in COUNTED.items():
        stats[name] = sum(1 for line, _ in span if re.search(pattern, line))
    return stats


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sass", help="nvdisasm -g -c output")
    parser.add_argument("--match", default="", help="only kernels whose mangled name contains this")
    parser.add_argument("--by-line", type=int, default=0, help="also the N busiest source lines of the span")
    args = parser.parse_args()
    for name, instructions in functions(args.sass).items():
        if args.match in name and wgmma_span(instructions):
            stats = loop_stats(instructions)
            print(name[-80:], " ".join(f"{key} {value}" for key, value in stats.items()))
            lines = Counter(source for _, source in wgmma_span(instructions))
            for source, count in lines.most_common(args.by_line):
                print(f"  {count:5d} {source}")


if __name__ == "__main__":
    main()
