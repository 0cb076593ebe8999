"""Which wgmma instructions of a PTX listing read a register operand that no instruction of their
loop writes: a loop-invariant A fragment.

Why it matters: on the H100 (2026-12-06, RESULTS.md "Query-tile boxes") the forward with its query
tile as such an operand (loaded once before the key loop, read by q @ K^T in every step) was
built by ptxas 12.8 and 13.0 with the probabilities of each step packed into the same registers,
so every step after the first multiplied the wrong queries. The PTX was right; only the SASS
shows the clash, and only in some builds. Kernels whose loop-invariant A fragments stay in shared
memory (wgmma reads them through a descriptor) cannot meet it, so the compile tests require that
of every kernel.
"""

from __future__ import annotations

import re
from typing import List, Tuple

_LABEL = re.compile(r"^\s*(\$L__\w+):")
_BRANCH = re.compile(r"\bbra(?:\.uni)?\s+(\$L__\w+);")
# wgmma with its A fragment in registers: {accumulators}, {A registers}, B descriptor, ...
_REGISTER_A = re.compile(r"wgmma\.mma_async\S*\s+\{[^}]*\},\s*\{([^}]*)\},")
_OPCODE = re.compile(r"^\s*(?:@!?%p\d+\s+)?[a-z][\w.:]*\s+(.*)$")


def _loops(lines: List[str]) -> List[Tuple[int, int]]:
    """(first line, last line) of every loop: a branch back to a label above it."""
    labels = {m.group(1): i for i, line in enumerate(lines) if (m := _LABEL.match(line))}
    loops = []
    for i, line in enumerate(lines):
        m = _BRANCH.search(line)
        if m and m.group(1) in labels and labels[m.group(1)] < i:
            loops.append((labels[m.group(1)], i))
    return loops


def _written(line: str) -> List[str]:
    """Registers an instruction writes: its first operand, or the registers of a first operand
    in braces (ldmatrix, vector loads, wgmma accumulators)."""
    m = _OPCODE.match(line)
    if not m or line.lstrip().startswith("//"):
        return []
    operands = m.group(1).strip()
    if operands.startswith("{"):
        return re.findall(r"%\w+", operands[:operands.index("}")])
    first = operands.split(",", 1)[0]
    return re.findall(r"%\w+", first) if "," in operands else []


def loop_invariant_register_operands(ptx: str) -> List[int]:
    """Line numbers (1-based) of the wgmma instructions inside a loop whose register A fragment
    no instruction of that loop writes."""
    lines = ptx.splitlines()
    loops = _loops(lines)
    found = []
    for i, line in enumerate(lines):
        m = _REGISTER_A.search(line)
        if not m:
            continue
        fragment = set(re.findall(r"%\w+", m.group(1)))
        for first, last in loops:
            if first <= i <= last:
                written = {reg for body in lines[first:last + 1] for reg in _written(body)}
                if not fragment & written:
                    found.append(i + 1)
                    break
    return found
