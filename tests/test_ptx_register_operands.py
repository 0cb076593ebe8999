"""benchmarks/ptx_register_operands.py: the loop-invariant register fragments of wgmma, found in
PTX listings shaped as Triton writes them (the real kernels are checked in test_sm90_compile.py)."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
from ptx_register_operands import loop_invariant_register_operands  # noqa: E402

ACC = "{%r10,%r11,%r12,%r13}"


def listing(before, body):
    """A kernel: ``before`` the loop, then a loop whose body is ``body`` (a back edge closes it)."""
    return "\n".join(["\tmov.b32 \t%r1, 0;", *before, "$L__BB0_2:", *body,
                      "\tsetp.lt.s32 \t%p1, %r1, %r2;", "\t@%p1 bra \t$L__BB0_2;", "\tret;"])


def wgmma(a_fragment):
    return f"\twgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {ACC}, {a_fragment}, %rd5, %p2, 1, 1, 1;"


def test_a_fragment_loaded_before_the_loop_is_found():
    ptx = listing(["\tldmatrix.sync.aligned.m8n8.x4.shared.b16 {%r20, %r21, %r22, %r23}, [%r3];"],
                  ["\twgmma.fence.sync.aligned;", wgmma("{%r20,%r21,%r22,%r23}"),
                   "\tcvt.rn.bf16x2.f32 \t%r30, %r10, %r11;"])
    assert loop_invariant_register_operands(ptx) == [5]


def test_fragments_written_in_the_loop_and_descriptor_operands_are_not():
    written = listing([], ["\tcvt.rn.bf16x2.f32 \t%r20, %r10, %r11;", "\t@%p3 ld.shared.b32 \t%r21, [%r4];",
                           wgmma("{%r20,%r21}")])
    assert loop_invariant_register_operands(written) == []
    through_shared_memory = listing([], [f"\twgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {ACC}, %rd4, %rd5, "
                                         "%p2, 1, 1, 1, 1;"])
    assert loop_invariant_register_operands(through_shared_memory) == []
    outside_any_loop = "\n".join(["\tldmatrix.sync.aligned.m8n8.x4.shared.b16 {%r20, %r21, %r22, %r23}, [%r3];",
                                  wgmma("{%r20,%r21,%r22,%r23}"), "\tret;"])
    assert loop_invariant_register_operands(outside_any_loop) == []
