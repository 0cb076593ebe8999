"""What both Gluon probes set up: the shared memory (each consumer warpgroup's query tile, a ring
of ``STAGES`` K and V slots, and the mbarriers that hand them between the producer warp and the
consumers; a slot is refilled once every consumer has arrived on its "empty" barrier), and the
register layouts of a consumer's wgmma accumulators and of P as the second product's operand."""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier
from triton.runtime.jit import constexpr_function


@gluon.jit
def allocate_ring(q_desc, k_desc, v_desc, CONSUMERS: gl.constexpr, STAGES: gl.constexpr, QBUFS: gl.constexpr):
    """(query tiles, K slots, V slots, q_ready, k_ready, k_empty, v_ready, v_empty), initialised:
    ``QBUFS`` query tiles a consumer (slot ``box * CONSUMERS + consumer``), each with its own
    q_ready barrier; a K/V slot's "empty" barriers wait for all CONSUMERS."""
    q_smem = gl.allocate_shared_memory(q_desc.dtype, [QBUFS * CONSUMERS] + q_desc.block_type.shape, q_desc.layout)
    k_bufs = gl.allocate_shared_memory(k_desc.dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)
    v_bufs = gl.allocate_shared_memory(v_desc.dtype, [STAGES] + v_desc.block_type.shape, v_desc.layout)
    q_ready = gl.allocate_shared_memory(gl.int64, [QBUFS * CONSUMERS, 1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for q_slot in gl.static_range(QBUFS * CONSUMERS):
        mbarrier.init(q_ready.index(q_slot), count=1)
    for slot in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(slot), count=1)
        mbarrier.init(v_ready.index(slot), count=1)
        mbarrier.init(k_empty.index(slot), count=CONSUMERS)
        mbarrier.init(v_empty.index(slot), count=CONSUMERS)
    return q_smem, k_bufs, v_bufs, q_ready, k_ready, k_empty, v_ready, v_empty


@constexpr_function
def accumulator_layout(columns):
    """One consumer warpgroup's (4 warps') wgmma accumulator of ``columns`` columns, 16-bit operands."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, columns, 16])


@constexpr_function
def probabilities_layout(o_layout):
    """P in registers as the A operand of O += P V (accumulated in ``o_layout``)."""
    return gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
