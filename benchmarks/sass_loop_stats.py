"""Size and make-up of the cuda backend's Hopper consumer loops, from a disassembly with line info,
without a GPU: per kernel instance, its instructions, and within the span from its first wgmma
(HGMMA) to its last (the consumers' tile loop) the instructions, barrier operations (SYNCS),
branches, reconvergence points (BSSY), local-memory spills (LDL/STL) and shared loads (LDS);
with ``--by-line N`` also the N source lines with the most instructions in that span; with
``--events`` the span as a sequence of the steps that order a software pipeline (wgmma issues and
waits, exponentials, maxima, masks, mbarrier waits and arrivals), runs of one kind collapsed, and
how many exponentials each "wait for all but the newest group" leaves before the next full wait:
the softmax work that runs under the product still in flight (ptxas schedules a wgmma wait as early
as its basic block allows, so the source order alone does not decide it; RESULTS.md, 2026-12-02).
With ``--fragments`` instead: the instructions that overwrite A fragments held in registers while
a later product still reads them (tests/test_cuda_build.py runs this check on every build).

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


# The instructions a pipeline's order is read from, in the order they are tested.
EVENTS = (("HGMMA", re.compile(r"HGMMA\.(\S+)")), ("wait", re.compile(r"WARPGROUP\.DEPBAR\.LE gsb0, (0x[0-9a-f]+)")),
          ("EX2", re.compile(r"MUFU\.EX2")), ("FMNMX", re.compile(r"\bFMNMX\b")),
          ("mask", re.compile(r"FSEL\b.*-INF")), ("mbarrier wait", re.compile(r"SYNCS\.PHASECHK")),
          ("mbarrier arrive", re.compile(r"SYNCS\.ARRIVE")))


def pipeline_events(instructions: list) -> list:
    """The wgmma span as [kind, count] runs: 'HGMMA <shape>', 'wait <groups left>', 'EX2', ..."""
    runs = []
    for line, _ in wgmma_span(instructions):
        for kind, pattern in EVENTS:
            found = pattern.search(line)
            if found:
                name = f"{kind} {found.group(1)}" if found.groups() else kind
                if runs and runs[-1][0] == name:
                    runs[-1][1] += 1
                else:
                    runs.append([name, 1])
                break
    return runs


def exponentials_under_products(runs: list) -> list:
    """For each wait that leaves one group in flight, the exponentials before the next full wait."""
    counts, open_count = [], None
    for name, count in runs:
        if name == "wait 0x1":
            open_count = 0
        elif name == "wait 0x0" and open_count is not None:
            counts.append(open_count)
            open_count = None
        elif name == "EX2" and open_count is not None:
            open_count += count
    return counts


LABEL = re.compile(r"^\s*(\.L_x_\d+):")
BRANCH_TARGET = re.compile(r"\bBRA\b.*`\((\.L_x_\d+)\)")
# A K-major wgmma whose A operand comes from registers (S = Q K^T with Q's fragments held): its
# fragments' first register. A ".tnspB" product (P V, dS K) takes fresh fragments each step.
REGISTER_A = re.compile(r"HGMMA\.\S+ R\d+, R(\d+), gdesc\[\w+\](?!\.tnspB)")
WRITTEN = re.compile(r"\*/\s+(?:@!?U?P\w+\s+)?([A-Z][\w.]*)\s+R(\d+)\b")
# Instructions whose first register operand is read, not written.
READS_FIRST = ("HGMMA", "ST", "BRA", "SYNCS", "RED", "ATOM")


def listings(path: str) -> dict:
    """Each function's lines, labels included (the loops' back edges are read from them)."""
    found, current = {}, None
    for line in open(path):
        section = re.match(r"\s*\.section\s+\.text\.([^,\s]+)", line)
        if section:
            current = found.setdefault(section.group(1), [])
        elif current is not None and (INSTRUCTION.search(line) or LABEL.match(line)):
            current.append(line.rstrip("\n"))
    return found


def fragment_overwrites(lines: list) -> list:
    """Instructions that write a register of held A fragments while a later product (in the code,
    or through a loop's back edge) still reads them: from the fragments' first load (LDSM) to their
    last read, or to the branch of a loop that jumps back before it. ptxas 13.0 did so across a
    branch in the backward's 1-D kernels (RESULTS.md, 2026-12-02): the next tile's product then
    read other values, with no warning. A write that only feeds the LDSM reloading the same
    registers (reloaded_next) is not one."""
    held, last = set(), -1
    for i, line in enumerate(lines):
        found = REGISTER_A.search(line)
        if found:
            held |= set(range(int(found.group(1)), int(found.group(1)) + 4))
            last = i
    if not held:
        return []
    labels = {LABEL.match(line).group(1): i for i, line in enumerate(lines) if LABEL.match(line)}
    for i, line in enumerate(lines):
        target = BRANCH_TARGET.search(line)
        if target and i > last and labels.get(target.group(1), len(lines)) < last:
            last = i
    loads = [i for i, line in enumerate(lines) if "LDSM" in line and (m := re.search(r"LDSM\S* R(\d+)", line))
             and int(m.group(1)) in held]
    first = loads[0] if loads else 0
    bad = []
    for i in range(first, last):
        written = WRITTEN.search(lines[i])
        if (written and not written.group(1).startswith(("LDSM",) + READS_FIRST) and int(written.group(2)) in held
                and not reloaded_next(lines, i + 1, int(written.group(2)))):
            bad.append(lines[i].strip())
    return bad


def reloaded_next(lines: list, start: int, register: int) -> bool:
    """Whether an LDSM writes `register` again before any product, branch or label from `start`
    on: the fragments are being reloaded (a pair's new queries), and the write was only their
    load's address, so no product reads it."""
    for line in lines[start:]:
        if LABEL.match(line) or "HGMMA" in line or re.search(r"\bBRA\b", line):
            return False
        loaded = re.search(r"LDSM\S* R(\d+)", line)
        if loaded and int(loaded.group(1)) <= register < int(loaded.group(1)) + 4:
            return True
    return False


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
    parser.add_argument("--events", action="store_true", help="also the span's pipeline steps in order")
    parser.add_argument("--fragments", action="store_true",
                        help="only: per kernel, the writes to held A fragments that a later product reads")
    args = parser.parse_args()
    if args.fragments:
        for name, lines in listings(args.sass).items():
            if args.match in name:
                bad = fragment_overwrites(lines)
                print(f"{'BAD ' + str(len(bad)) if bad else 'ok'} {name[-120:]}", *bad[:3], sep="\n  ")
        return
    for name, instructions in functions(args.sass).items():
        if args.match in name and wgmma_span(instructions):
            stats = loop_stats(instructions)
            print(name[-80:], " ".join(f"{key} {value}" for key, value in stats.items()))
            lines = Counter(source for _, source in wgmma_span(instructions))
            for source, count in lines.most_common(args.by_line):
                print(f"  {count:5d} {source}")
            if args.events:
                runs = pipeline_events(instructions)
                print("  " + ", ".join(f"{name} x{count}" if count > 1 else name for name, count in runs))
                print(f"  exponentials under a product in flight, per partial wait: {exponentials_under_products(runs)}")


if __name__ == "__main__":
    main()
