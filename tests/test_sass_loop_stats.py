"""The Hopper kernels' measuring tools: benchmarks/sass_loop_stats.py's pipeline view
(``--events``), on a hand-written disassembly (the order of a loop's wgmma issues and waits, and how
many exponentials run while a product is in flight, are what it is read for when checking where
ptxas put a wait, docs/backend-cuda.md); benchmarks/make_ablation_tree.py's edits of csrc/."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
from make_ablation_tree import ABLATIONS, write_ablation  # noqa: E402
from sass_loop_stats import exponentials_under_products, fragment_overwrites, functions, listings, pipeline_events  # noqa: E402

# Two loop steps as nvdisasm -g -c lays them out: the first with its exponentials after the full
# wait (none under the product), the second with two of them before it.
LISTING = """\
\t.section\t.text.kernel_a,"ax",@progbits
\t//## File "kernel.cu", line 10
        /*0010*/                   HGMMA.64x64x16.F32.BF16 R88, R148, gdesc[UR4], RZ, !UPT ;
        /*0020*/                   HGMMA.64x64x16.F32.BF16 R88, R144, gdesc[UR4], R88, gsb0 ;
        /*0030*/                   HGMMA.64x128x16.F32.BF16 R24, R168, gdesc[UR8].tnspB, R24, gsb0 ;
        /*0040*/                   WARPGROUP.DEPBAR.LE gsb0, 0x1 ;
        /*0050*/                   FSEL R89, R89, -INF , P3 ;
        /*0060*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
        /*0070*/                   FMNMX R18, R88, R89, !PT ;
        /*0080*/                   MUFU.EX2 R21, R169 ;
        /*0090*/                   MUFU.EX2 R22, R170 ;
        /*00a0*/                   SYNCS.ARRIVE.TRANS64.A1T0 RZ, [R99+URZ], RZ ;
        /*00b0*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [R21+URZ], R20 ;
        /*00c0*/                   HGMMA.64x64x16.F32.BF16 R88, R148, gdesc[UR4], RZ, !UPT ;
        /*00d0*/                   HGMMA.64x128x16.F32.BF16 R24, R168, gdesc[UR8].tnspB, R24, gsb0 ;
        /*00e0*/                   WARPGROUP.DEPBAR.LE gsb0, 0x1 ;
        /*00f0*/                   MUFU.EX2 R21, R169 ;
        /*0100*/                   MUFU.EX2 R22, R170 ;
        /*0110*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
        /*0120*/                   MUFU.EX2 R23, R171 ;
        /*0130*/                   HGMMA.64x128x16.F32.BF16 R24, R168, gdesc[UR8].tnspB, R24, gsb0 ;
        /*0140*/                   MUFU.EX2 R23, R171 ;
"""


def test_events_give_the_loop_order_and_the_exponentials_under_each_product(tmp_path):
    path = tmp_path / "kernel.sass"
    path.write_text(LISTING)
    instructions = functions(str(path))["kernel_a"]
    runs = pipeline_events(instructions)
    assert [name for name, _ in runs[:9]] == [
        "HGMMA 64x64x16.F32.BF16", "HGMMA 64x128x16.F32.BF16", "wait 0x1", "mask", "wait 0x0", "FMNMX", "EX2",
        "mbarrier arrive", "mbarrier wait"]
    assert runs[0] == ["HGMMA 64x64x16.F32.BF16", 2] and runs[6] == ["EX2", 2]
    # The span ends at the last wgmma: the exponential after it is not part of the loop.
    assert runs[-1] == ["HGMMA 64x128x16.F32.BF16", 1]
    assert exponentials_under_products(runs) == [0, 2]


# A tile loop holding an operand's A fragments (R120-R123, loaded once before the loop): the
# product of dS (R124-R127, packed in the loop) reads fresh fragments; REUSED packs dS into the held
# registers instead, as ptxas 13.0 did across a branch, which the loop's next S product then reads.
HELD_LOOP = """\
\t.section\t.text.{name},"ax",@progbits
        /*0010*/                   LDSM.16.M88.4 R120, [R32] ;
.L_x_1:
        /*0020*/                   WARPGROUP.ARRIVE ;
        /*0030*/                   HGMMA.64x64x16.F32.BF16 R56, R120, gdesc[UR12], RZ, !UPT, gsb0 ;
        /*0040*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
        /*0050*/                   F2FP.BF16.F32.PACK_AB {packed}, R57, R56 ;
        /*0060*/                   HGMMA.64x64x16.F32.BF16 R88, {packed}, gdesc[UR16].tnspB, R88, gsb0 ;
        /*0070*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
        /*0080*/              @!P4 BRA `(.L_x_1) ;
        /*0090*/                   MOV R121, R88 ;
"""


def test_fragment_check_finds_held_registers_overwritten_inside_the_loop(tmp_path):
    path = tmp_path / "kernel.sass"
    path.write_text(HELD_LOOP.format(name="fresh", packed="R124") + HELD_LOOP.format(name="reused", packed="R120"))
    found = listings(str(path))
    assert fragment_overwrites(found["fresh"]) == []  # the write after the loop's branch is free
    assert [line.split()[1] for line in fragment_overwrites(found["reused"])] == ["F2FP.BF16.F32.PACK_AB"]


# Fragments reloaded inside the loop (a new pair's queries): the reload's address may be computed
# into the fragment's own register right before the LDSM that overwrites it. The "branch" copy
# puts a branch between the two, so the loop's next product could read the address instead.
RELOAD_LOOP = """\
\t.section\t.text.{name},"ax",@progbits
        /*0010*/                   LDSM.16.M88.4 R120, [R32] ;
.L_x_1:
        /*0020*/                   WARPGROUP.ARRIVE ;
        /*0030*/                   HGMMA.64x64x16.F32.BF16 R56, R120, gdesc[UR12], RZ, !UPT, gsb0 ;
        /*0040*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
        /*0050*/                   LEA R120, R6, UR20, 0x1 ;
{between}        /*0070*/                   LDSM.16.M88.4 R120, [R120+0x2000] ;
        /*0080*/              @!P4 BRA `(.L_x_1) ;
"""


def test_fragment_check_allows_a_reload_address_in_the_reloaded_registers(tmp_path):
    path = tmp_path / "kernel.sass"
    branch = "        /*0060*/              @P1 BRA `(.L_x_1) ;\n"
    path.write_text(RELOAD_LOOP.format(name="address", between="") + RELOAD_LOOP.format(name="branch", between=branch))
    found = listings(str(path))
    assert fragment_overwrites(found["address"]) == []
    assert [line.split()[1] for line in fragment_overwrites(found["branch"])] == ["LEA"]


def test_every_ablation_still_finds_its_lines_in_csrc(tmp_path):
    """Each ablation replaces lines of the kernels as they stand: a change to those lines must
    update the ablation, or its timings would silently measure the kernels unchanged."""
    for name, edits in ABLATIONS.items():
        target = tmp_path / name
        write_ablation(name, str(target))
        for file, old, new in edits:
            text = (target / file).read_text()
            assert old not in text and text.count(new) == 1, (name, file)
