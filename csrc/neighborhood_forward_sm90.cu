// Fused forward pass for Hopper (sm_90a): persistent, warp-specialised, warpgroup MMA, TMA.
//
// A CTA stays on its SM and takes pair tiles (pair_tiles.cuh: two 64-query tiles of one (batch,
// head, dilation group)) in turn. Three warpgroups split the work:
//   * one producer thread issues the copies: each pair's two query halves (double-buffered, so
//     the next pair's load overlaps this one's tail) and the pair's key tiles (key_tiles.cuh:
//     spatial 64-token boxes over the union key box), each K or V tile one TMA copy per 64
//     channels into a ring of shared-memory stages in the 128-byte-swizzled layout wgmma reads;
//     the copy engine counts the bytes in on each stage's "full" mbarrier;
//   * two planning warps of the same warpgroup work out each pair's geometry (pair_plans.cuh:
//     its key tiles, each half's tile ranges, each row's window and LSE index) into a ring of
//     plans, up to kPlanStages pairs ahead;
//   * each consumer warpgroup owns one half (64 queries) and, for the key tiles that meet its own
//     key box, computes S = Q K^T (wgmma, both from smem), masks tiles that are not inside every
//     one of its rows' windows, runs the online softmax in registers and accumulates O += P V
//     (wgmma, P from registers); every stage is freed on its "empty" mbarrier by both consumers,
//     so the producer runs up to the ring's depth ahead.
// While one consumer runs its softmax the other's tensor-core work proceeds, and the copies of
// one pair overlap the other pair's math and epilogue.
#include <cuda_runtime.h>
#include <cute/arch/copy_sm90_desc.hpp>
#include <cute/arch/copy_sm90_tma.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "attention_params.h"
#include "kernel_launch.h"
#include "key_tiles.cuh"
#include "mma_fragments.cuh"
#include "pair_plans.cuh"
#include "pair_tiles.cuh"
#include "pair_tiling.h"
#include "row_output.cuh"
#include "row_windows.cuh"
#include "sm90_common.cuh"
#include "tensor_maps.h"
#include "token_tiles.cuh"
#include "wgmma_ops.cuh"

namespace haloattn {
namespace sm90 {
namespace {

// Registers per thread after the role split (setmaxnreg): the producer warpgroup is one thread
// issuing copies and two warps planning pairs, each lane holding one pair's geometry (with 40
// registers they spilled about 800 bytes; 72 leave about 200, all in that geometry), the
// consumers hold Q's fragments, S, O, two P buffers and their rows' windows (216 leave no
// spills in the steps; at rank 3 a few per-pair scalars spill).
constexpr int kProducerRegisters = 72;
constexpr int kConsumerRegisters = 216;
constexpr int kPlanningWarps = kConsumers;  // warps 1 and 2, one per half
constexpr int kPlanStages = 4;              // plans written ahead of the consumers
constexpr int kTurnBarrier = 3;             // named barriers 3 and 4: the consumers' turns
constexpr int kTurnMinTiles = 16;           // the shortest walk whose pairs take turns
static_assert(register_split_fits(kProducerRegisters, kConsumerRegisters), "the register split exceeds the launch allocation");

// The ring's tiles are consumed in a software pipeline with two P register buffers. 128-key
// chunks (2 deep, consumed one at a time, as S, O and one P filled the registers of the earlier
// cp.async kernel) measured 0.67-0.95x of this.

// The forward's ring depth. With the stages shared by both consumers, a half can run at most the
// ring's depth ahead of the other; at head dim 64 a stage is 16 KiB and eight fit beside the
// query buffers and plans (about 178 KiB), at 128 four (about 211 KiB of the 227 an SM has).
constexpr int forward_stages(int head_dim) { return head_dim <= 64 ? 8 : kStages; }

template <typename T, int D>
struct Smem {
  static constexpr int kRing = forward_stages(D);
  static constexpr int kQElems = kHalfRows * D;  // one half's [64][D] queries
  static constexpr int kTileElems = kChunk * D;  // a [kChunk][D] key or value tile
  static constexpr size_t kTileBytes = kTileElems * sizeof(T);
  static constexpr size_t kQ = 0;                                          // [buffer][half][64][D]
  static constexpr size_t kK = kQ + 2 * kConsumers * kQElems * sizeof(T);  // [stage][kChunk][D]
  static constexpr size_t kV = kK + kRing * kTileBytes;
  // Prefix masks of the key tile shape (key_tiles.cuh), [axis][kMaskEntries].
  static constexpr size_t kBelow = kV + kRing * kTileBytes;
  // The ring of pair plans (pair_plans.cuh).
  static constexpr size_t kPlans = (kBelow + kMaxRank * kMaskEntries * sizeof(uint64_t) + 15) / 16 * 16;
  static constexpr size_t kBarriers = kPlans + kPlanStages * sizeof(PairPlan);
  // Q full[2], Q empty[2], K/V full[stages], K/V empty[stages], plan full[plan stages], plan
  // empty[plan stages].
  static constexpr int kBarrierCount = 4 + 2 * kRing + 2 * kPlanStages;
  static constexpr size_t kBytes = kBarriers + kBarrierCount * sizeof(uint64_t);
  // Tiles must start 1024-byte aligned (the swizzle is applied to address bits); dynamic shared
  // memory is only promised 16, so the launch asks for one alignment's worth more.
  static constexpr size_t kLaunchBytes = kBytes + 1024;
  static_assert(kTileBytes % 1024 == 0, "tiles 1024-aligned");
  static_assert(kPlans % alignof(PairPlan) == 0, "plans aligned");
  static_assert(kPlanHalfRows == kHalfRows, "a plan holds a consumer's rows");
};

template <typename T, int D>
__device__ inline void produce(const AttentionParams& p, const TileShape& shape, const KeyTiling& kt, int64_t pairs,
                               const ForwardMaps& maps, T* sQ, T* sK, T* sV, uint64_t* q_full, uint64_t* q_empty,
                               uint64_t* full, uint64_t* empty) {
  using L = Smem<T, D>;
  const TileShape half = half_shape(shape);
  const int q_rows = half.n[0] * half.n[1] * half.n[2];
  // Neighbouring pairs re-read most of each other's keys from L2: keep them there.
  const uint64_t keep = static_cast<uint64_t>(cute::TMA::CacheHintSm90::EVICT_LAST);
  const uint64_t stream = static_cast<uint64_t>(cute::TMA::CacheHintSm90::EVICT_FIRST);
  int chunk_count = 0, pair_count = 0;
  for (int64_t pair = blockIdx.x; pair < pairs; pair += gridDim.x) {
    const PairTiles t = pair_tiles(p, shape, kt, pair);
    const TileWork& w = t.work;
    if (w.empty) continue;
    const int kv_head = div_nonneg(w.head, div_nonneg(p.heads, p.kv_heads));
    const int buffer = pair_count & 1;
    // The consumers release a query buffer (two pairs back) once its queries are in registers.
    if (pair_count >= 2) Barrier::wait(&q_empty[buffer], ((pair_count >> 1) - 1) & 1);
    const TileHalf second = tile_half(w, shape, 1);
    const int halves = second.work.empty ? 1 : 2;
    TxBarrier::arrive_and_expect_tx(&q_full[buffer], halves * q_rows * D * sizeof(T));
    for (int h = 0; h < halves; ++h) {
      const TileHalf th = tile_half(w, shape, h);
      copy_box<D>(&maps.query, &q_full[buffer], sQ + (buffer * kConsumers + h) * L::kQElems, kHalfRows, p, w, w.head,
                  th.work.x0, stream);
    }
    TileCursor cursor{{0, 0, 0}};
    for (int c = 0; c < t.chunks; ++c) {
      const int n = chunk_count + c, stage = stage_of<L::kRing>(n);
      if (n >= L::kRing) Barrier::wait(&empty[stage], phase_of<L::kRing>(n) ^ 1);
      TxBarrier::arrive_and_expect_tx(&full[stage], 2 * L::kTileBytes);
      int x[kMaxRank];
      for (int a = 0; a < kMaxRank; ++a) x[a] = t.start[a] + cursor.i[a] * kt.n[a];
      copy_box<D>(&maps.key, &full[stage], sK + stage * L::kTileElems, kChunk, p, w, kv_head, x, keep);
      copy_box<D>(&maps.value, &full[stage], sV + stage * L::kTileElems, kChunk, p, w, kv_head, x, keep);
      step_tile(cursor, t.tiles);
    }
    chunk_count += t.chunks;
    ++pair_count;
  }
}

// The planning warps, one per half. Each lane works out the pair-level geometry (the part that
// divides) of one of the CTA's next 32 pairs, so a warp's latency is spent once per 32 pairs;
// then, pair by pair in order, the owning lane writes the pair's and the half's fields and every
// lane two of the half's rows. Laid out per pair (every lane on the same pair, two warps, the
// plan ring tied to the query buffers) the planning measured 0.93x on a four-tile walk: its
// latency then exceeded a pair's time. The last plan is marked done.
__device__ inline void plan_pairs(const AttentionParams& p, const TileShape& shape, const KeyTiling& kt, int64_t pairs,
                                  int half, PairPlan* plans, uint64_t* plan_full, uint64_t* plan_empty) {
  const int lane = threadIdx.x % 32;
  const TileShape half_tile = half_shape(shape);
  int pair_count = 0;
  // Waits for plan `pair_count`'s stage to be free and returns it.
  auto claim = [&]() -> PairPlan& {
    const int stage = pair_count % kPlanStages;
    if (pair_count >= kPlanStages) Barrier::wait(&plan_empty[stage], (pair_count / kPlanStages - 1) & 1);
    return plans[stage];
  };
  const int64_t batch_step = static_cast<int64_t>(gridDim.x) * 32;
  for (int64_t first = blockIdx.x; first < pairs; first += batch_step) {
    const int64_t pair = first + static_cast<int64_t>(lane) * gridDim.x;
    PairTiles t;
    t.work.empty = true;
    if (pair < pairs) t = pair_tiles(p, shape, kt, pair);
    TileHalf h;
    HalfTiles own;
    if (!t.work.empty) {
      h = tile_half(t.work, shape, half);
      own = half_tiles(p, t, h, kt);
    }
    for (unsigned todo = __ballot_sync(~0u, !t.work.empty); todo != 0; todo &= todo - 1) {
      const int owner = __ffs(todo) - 1;
      PairPlan& plan = claim();
      if (lane == owner) {
        if (half == 0) {
          plan.done = 0;
          plan.walk = key_tile_walk(t);
        }
        plan.half[half].work = h.work;
        plan.half[half].own = own;
      }
      __syncwarp();  // the owner's half tile, read back by every lane
      write_half_rows(p, half_tile, plan.half[half].work, lane, plan.rows[half]);
      // Every lane arrives (the barrier counts both warps' lanes): each lane's writes are
      // released by its own arrival, and the consumers' wait acquires them.
      Barrier::arrive(&plan_full[pair_count % kPlanStages]);
      ++pair_count;
    }
  }
  PairPlan& last = claim();
  if (half == 0 && lane == 0) last.done = 1;
  Barrier::arrive(&plan_full[pair_count % kPlanStages]);
}

template <typename T, int D, int RANK>
__device__ inline void consume(const AttentionParams& p, const KeyTiling& kt,
                               const CUtensorMap* out_map, T* sQ, const T* sK, const T* sV, const uint64_t* below,
                               const PairPlan* plans, uint64_t* plan_full, uint64_t* plan_empty, uint64_t* q_full, uint64_t* q_empty,
                               uint64_t* full, uint64_t* empty) {
  using L = Smem<T, D>;
  constexpr int kSRegs = kChunk / 2;  // S accumulators per thread (64 x kChunk over 128 threads)
  constexpr int kORegs = D / 2;
  constexpr int kKeyTiles = kChunk / 8;
  const int half = threadIdx.x / kWarpgroup - 1;
  const int tid = threadIdx.x % kWarpgroup;
  const int warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;
  const float scale_log2 = p.scale * kLog2e;
  int chunk_count = 0, pair_count = 0;
  // The warpgroup's thread 0 releases a query buffer only once the copy engine has read the
  // previous pair's output out of it (the epilogue below): at the next pair's start, or at the
  // end. -1: nothing to release.
  int unreleased_buffer = -1;
  // The consumers take turns at issuing tensor-core work (FlashAttention-3's ping-pong): one
  // warpgroup's products of a key tile are issued, then the other's, so one runs its softmax
  // while the tensor cores work on the other's products instead of both waiting on their scores
  // at once. A turn is a key tile of the walk: each consumer takes one per tile, also for tiles
  // it only passes over, so both take the same number. Barrier 3 + h (1 and 2 are the
  // epilogues') is consumer h's turn; consumer 0 gets the first one. Only on 1-D grids, where
  // the halves walk long runs of the same tiles (forward 1.05-1.09x on walks of 18 and 33 tiles):
  // where their tiles differ (2-D, 3-D) each half waits at the other's run ends and passed-over
  // tiles (0.82-0.98x), also with turns on the tiles both compute only; and where both halves
  // walk the same tiles (2-D 32x32 stride 16) turns gained nothing (1.00x) while their code cost
  // the rank-2 loops 1-2.5 % (RESULTS.md, 2026-12-04). And only in pairs whose
  // walk has at least kTurnMinTiles tiles: on a walk of 6 (1-D window 255) the turns' waits cost
  // more than the overlap gains (0.95x). Both halves read the walk from the same plan, so they
  // agree on which pairs take turns; between such pairs the token stays where the last one left
  // it (an arrival on consumer 0's barrier).
  constexpr bool kTakeTurns = RANK == 1;
  bool turns = false;  // this pair's
  auto take_turn = [&]() {
    if (kTakeTurns && turns) named_barrier_sync(kTurnBarrier + half, kConsumers * kWarpgroup);
  };
  auto pass_turn = [&]() {
    if (kTakeTurns && turns) named_barrier_arrive(kTurnBarrier + (half ^ 1), kConsumers * kWarpgroup);
  };
  if (kTakeTurns && half == 0) named_barrier_arrive(kTurnBarrier, kConsumers * kWarpgroup);
  auto release_output_buffer = [&]() {
    if (tid == 0 && unreleased_buffer >= 0) {
      cute::tma_store_wait<0>();
      Barrier::arrive(&q_empty[unreleased_buffer]);
    }
    unreleased_buffer = -1;
  };

  for (;;) {
    const int buffer = pair_count & 1;
    // The pair's geometry, from the planning warps.
    const int plan_stage = pair_count % kPlanStages;
    Barrier::wait(&plan_full[plan_stage], (pair_count / kPlanStages) & 1);
    const PairPlan& plan = plans[plan_stage];
    if (plan.done) break;
    const KeyTileWalk tiles = plan.walk;
    const HalfTiles own = plan.half[half].own;
    turns = tiles.chunks >= kTurnMinTiles;

    // The two rows this thread accumulates: their neighbourhoods (group coordinates).
    const int row_a = warp * 16 + g, row_b = row_a + 8;
    const RowWindow win_a = plan.rows[half][row_a].window;
    const RowWindow win_b = plan.rows[half][row_b].window;

    float o[kORegs];
#pragma unroll
    for (int i = 0; i < kORegs; ++i) o[i] = 0.f;
    float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.f, l_b = 0.f;  // maxima in raw score units
    // The half's queries move to registers once (A fragments of S = Q K^T), so the scores'
    // wgmma reads only K from shared memory: with 64-key tiles, re-reading Q for every tile
    // would be a third of the consumers' shared-memory traffic. The buffer then stages the
    // half's output (the epilogue) and is released after that.
    uint32_t q[D / 16][4];
    T* const sQ_half = sQ + (buffer * kConsumers + half) * L::kQElems;
    release_output_buffer();
    {
      Barrier::wait(&q_full[buffer], (pair_count >> 1) & 1);
#pragma unroll
      for (int ks = 0; ks < D / 16; ++ks) {
        const TileCoord at = a_source(lane, 16 * warp, 16 * ks);
        ldmatrix_x4(q[ks], sQ_half + swizzled_element<kHalfRows>(at.row, at.col / 8));
      }
    }

    // S = Q K^T of a chunk, issued (not waited for).
    auto issue_scores = [&](float (&s)[kSRegs], int stage) {
      const T* sK_now = sK + stage * L::kTileElems;
#pragma unroll
      for (int ks = 0; ks < D / 16; ++ks) mma_rs_k<T, kChunk>(q[ks], k_major_descriptor<T, kChunk>(sK_now, ks), s, ks > 0);
      cute::warpgroup_commit_batch();
    };
    // O += P V of a chunk, issued (not waited for).
    auto issue_values = [&](const uint32_t (&pa)[kChunk / 16][4], int stage) {
      const T* sV_now = sV + stage * L::kTileElems;
#pragma unroll
      for (int kk = 0; kk < kChunk / 16; ++kk) mma_rs<T, D>(pa[kk], mn_major_descriptor<T, kChunk>(sV_now, kk), o);
      cute::warpgroup_commit_batch();
    };

    // The walk over the pair's key tiles: `c` and `cursor` name the current one.
    int c = -1;
    TileCursor cursor{{0, 0, -1}};

    // The current tile's key masks for this thread's two rows, worked out while its scores are
    // computed on the tensor cores (between the issue and the wait, where the warp would
    // otherwise only wait): about 50-110 integer instructions and eight shared loads a masked
    // tile that are then off the softmax's path. `masked` is false for tiles inside every one of
    // the half's rows' windows (one branch per tile, not per score), except on 3-D grids: there
    // every tile's mask is built and applied (all ones inside the common window), so the loop has
    // no branch left (with O rescaled on every step). That ran 3-D 1.02x, 3-D causal in time
    // 0.99-1.02x and 3-D 3x7x7 at head dim 64 1.04x; on 2-D grids, with fewer tiles masked, it ran
    // 0.89-0.98x (RESULTS.md, 2026-12-02 16:43-16:55 UTC).
    struct TileMask {
      bool masked;
      uint64_t a, b;  // bit 8j + e: this thread's score 4j + e (row a) or 4j + 2 + e (row b)
    };
    constexpr bool kMaskEveryTile = RANK == 3;
    auto tile_mask = [&]() {
      TileMask m{kMaskEveryTile || !tile_in(cursor, own.full_lo, own.full_hi), 0, 0};
      if (m.masked) {
        int origin[kMaxRank];
#pragma unroll
        for (int a = 0; a < kMaxRank; ++a) origin[a] = tiles.start[a] + cursor.i[a] * kt.n[a];
        // This thread's scores are keys 8j + 2t + e: shift its bits down to 8j + e.
        m.a = row_mask<RANK>(win_a, origin, kt, below) >> (2 * t);
        m.b = row_mask<RANK>(win_b, origin, kt, below) >> (2 * t);
      }
      return m;
    };

    // Mask, online softmax and P's A fragments of the current tile's scores; returns the rescale
    // factors of O (applied by the caller once no P V is still adding into O).
    auto softmax = [&](float (&s)[kSRegs], const TileMask& mask, uint32_t (&pa)[kChunk / 16][4], float& alpha_a,
                       float& alpha_b) {
      if (mask.masked) {
#pragma unroll
        for (int j = 0; j < kKeyTiles; ++j) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            if (!((mask.a >> (8 * j + e)) & 1)) s[4 * j + e] = -INFINITY;
            if (!((mask.b >> (8 * j + e)) & 1)) s[4 * j + 2 + e] = -INFINITY;
          }
        }
      }
      float tile_max_a = -INFINITY, tile_max_b = -INFINITY;
#pragma unroll
      for (int j = 0; j < kKeyTiles; ++j) {
        tile_max_a = fmaxf(tile_max_a, fmaxf(s[4 * j + 0], s[4 * j + 1]));
        tile_max_b = fmaxf(tile_max_b, fmaxf(s[4 * j + 2], s[4 * j + 3]));
      }
#pragma unroll
      for (int offset = 1; offset < 4; offset <<= 1) {
        tile_max_a = fmaxf(tile_max_a, __shfl_xor_sync(0xffffffff, tile_max_a, offset));
        tile_max_b = fmaxf(tile_max_b, __shfl_xor_sync(0xffffffff, tile_max_b, offset));
      }
      // Maxima stay in raw score units; the scale (> 0, so it keeps the order) joins in the one
      // FFMA before each exp2. A row with no key yet keeps max -inf: its base is 0 and its
      // rescale 1, never -inf - -inf.
      const float new_m_a = fmaxf(m_a, tile_max_a), new_m_b = fmaxf(m_b, tile_max_b);
      const float base_a = new_m_a == -INFINITY ? 0.f : new_m_a * scale_log2;
      const float base_b = new_m_b == -INFINITY ? 0.f : new_m_b * scale_log2;
      alpha_a = new_m_a == -INFINITY ? 1.f : fast_exp2(m_a * scale_log2 - base_a);
      alpha_b = new_m_b == -INFINITY ? 1.f : fast_exp2(m_b * scale_log2 - base_b);
      m_a = new_m_a;
      m_b = new_m_b;
      l_a *= alpha_a;
      l_b *= alpha_b;
#pragma unroll
      for (int j = 0; j < kKeyTiles; ++j) {
        s[4 * j + 0] = fast_exp2(fmaf(s[4 * j + 0], scale_log2, -base_a));
        s[4 * j + 1] = fast_exp2(fmaf(s[4 * j + 1], scale_log2, -base_a));
        s[4 * j + 2] = fast_exp2(fmaf(s[4 * j + 2], scale_log2, -base_b));
        s[4 * j + 3] = fast_exp2(fmaf(s[4 * j + 3], scale_log2, -base_b));
        l_a += s[4 * j + 0] + s[4 * j + 1];
        l_b += s[4 * j + 2] + s[4 * j + 3];
      }
      accumulator_to_fragments<T>(s, pa);
    };
    auto rescale = [&](float alpha_a, float alpha_b) {
      // Every step, although it is a no-op once the row maxima settle: skipping it took a vote
      // and a branch per step, and with them the step ran 1.0-1.07x slower (RESULTS.md,
      // 2026-12-02 16:33 UTC): the branch costs the schedule more than the multiplies it saves.
#pragma unroll
      for (int j = 0; j < kORegs / 4; ++j) {
        o[4 * j + 0] *= alpha_a;
        o[4 * j + 1] *= alpha_a;
        o[4 * j + 2] *= alpha_b;
        o[4 * j + 3] *= alpha_b;
      }
    };

    auto pass_over = [&]() {  // waits for the current tile, takes its turn (1-D) and releases it unused
      const int n = chunk_count + c;
      Barrier::wait(&full[stage_of<L::kRing>(n)], phase_of<L::kRing>(n));
      take_turn();
      pass_turn();
      Barrier::arrive(&empty[stage_of<L::kRing>(n)]);
    };
    auto next_tile = [&]() {
      ++c;
      step_tile(cursor, tiles.tiles);
    };

    // The tiles that meet this half's key box form a box in tile coordinates; walked in the
    // producer's row-major order they are runs of consecutive chunks. Tiles between runs are
    // only waited for and released (the ring needs both consumers); each run is one software
    // pipeline, drained before the next gap (the producer may need the last stage of a run
    // before it can fill the gap's tiles).
    next_tile();
    while (c < tiles.chunks) {
      if (!tile_in(cursor, own.first, own.end)) {
        pass_over();
        next_tile();
        continue;
      }
      const int run_end = c + run_length(cursor, own, tiles.tiles);
      // Software pipeline: a tile's S = Q K^T runs on the tensor cores while the previous
      // tile's P V does, and its softmax overlaps the tail of that P V.
      float s[kSRegs];
      uint32_t pa_prev[kChunk / 16][4], pa[kChunk / 16][4];
      float alpha_a, alpha_b;
      int prev_stage = stage_of<L::kRing>(chunk_count + c);
      Barrier::wait(&full[prev_stage], phase_of<L::kRing>(chunk_count + c));
      take_turn();
      cute::warpgroup_arrive();
      issue_scores(s, prev_stage);
      pass_turn();
      const TileMask first_mask = tile_mask();
      cute::warpgroup_wait<0>();
      fence_registers(s);
      softmax(s, first_mask, pa_prev, alpha_a, alpha_b);
      rescale(alpha_a, alpha_b);  // O holds earlier runs' sums (no P V is in flight)
      // One step: the next tile's scores and softmax (into `next`) around the P V of `current`.
      auto step = [&](uint32_t (&current)[kChunk / 16][4], uint32_t (&next)[kChunk / 16][4]) {
        next_tile();
        const int n = chunk_count + c, stage = stage_of<L::kRing>(n);
        Barrier::wait(&full[stage], phase_of<L::kRing>(n));
        take_turn();
        fence_registers(o);
        cute::warpgroup_arrive();
        issue_scores(s, stage);
        issue_values(current, prev_stage);
        pass_turn();
        const TileMask mask = tile_mask();
        cute::warpgroup_wait<1>();  // the scores (committed first) are ready
        fence_registers(s);
        softmax(s, mask, next, alpha_a, alpha_b);
        cute::warpgroup_wait<0>();  // the previous P V is done with O, its P and its stage
        fence_registers(o);
        fence_fragments(current);
        Barrier::arrive(&empty[prev_stage]);
        rescale(alpha_a, alpha_b);
        prev_stage = stage;
      };
      // Two steps per iteration, so P's two register buffers swap roles without a copy (a copy
      // would define a wgmma input inside the pipeline and serialise the MMAs).
      for (; c + 2 < run_end; ) {
        step(pa_prev, pa);
        step(pa, pa_prev);
      }
      if (c + 1 < run_end) {
        step(pa_prev, pa);
        fence_registers(o);
        cute::warpgroup_arrive();
        issue_values(pa, prev_stage);
      } else {
        fence_registers(o);
        cute::warpgroup_arrive();
        issue_values(pa_prev, prev_stage);
      }
      cute::warpgroup_wait<0>();
      fence_registers(o);
      fence_fragments(pa_prev);
      fence_fragments(pa);
      Barrier::arrive(&empty[prev_stage]);
      next_tile();
    }
    chunk_count += tiles.chunks;
    ++pair_count;

    // Epilogue: O / l, as 16-bit values, into the half's query buffer in the layout the query
    // copy wrote it (row r of the box at row r), then one bulk tensor copy per 64 channels to
    // the output, issued by thread 0 once every thread's writes are in. Sixteen 4-byte global
    // stores per row and thread queued behind each other held 14 % of the samples on 16x16
    // stride 16 (Nsight Compute, 2026-11-27); the copy engine also skips the rows past the grid.
    // The natural-log LSE (maxima in raw units) is one 4-byte store per row.
    l_a = quad_sum(l_a);
    l_b = quad_sum(l_b);
    const float inv_a = l_a > 0.f ? 1.f / l_a : 0.f, inv_b = l_b > 0.f ? 1.f / l_b : 0.f;
#pragma unroll
    for (int j = 0; j < kORegs / 4; ++j) {
      *reinterpret_cast<uint32_t*>(sQ_half + swizzled_element<kHalfRows>(row_a, j) + 2 * t) =
          pack2<T>(o[4 * j + 0] * inv_a, o[4 * j + 1] * inv_a);
      *reinterpret_cast<uint32_t*>(sQ_half + swizzled_element<kHalfRows>(row_b, j) + 2 * t) =
          pack2<T>(o[4 * j + 2] * inv_b, o[4 * j + 3] * inv_b);
    }
    // (Read from the plan here, not held in registers through the pair.)
    const int64_t lse_a = plan.rows[half][row_a].lse, lse_b = plan.rows[half][row_b].lse;
    if (lse_a >= 0) store_lse_at(p, lse_a, l_a, m_a * scale_log2, t);
    if (lse_b >= 0) store_lse_at(p, lse_b, l_b, m_b * scale_log2, t);
    // The writes (generic proxy) before the copy engine's reads (async proxy), by every writer;
    // the same fence orders the ldmatrix reads of Q before the engine's next write of the buffer.
    cutlass::arch::fence_view_async_shared();
    named_barrier_sync(1 + half, kWarpgroup);
    if (tid == 0) {
      const TileWork& out_tile = plan.half[half].work;
      if (!out_tile.empty) store_box<D>(out_map, sQ_half, kHalfRows, p, out_tile, out_tile.head, out_tile.x0);
      unreleased_buffer = buffer;
    } else {
      Barrier::arrive(&q_empty[buffer]);
    }
    Barrier::arrive(&plan_empty[plan_stage]);  // the pair's plan is read
  }
  // Consumer 1's last turn arrived on consumer 0's barrier (or, with no turns taken, consumer
  // 0's own first arrival is there): complete it, so no barrier is left half-arrived.
  if (kTakeTurns && half == 0) named_barrier_sync(kTurnBarrier, kConsumers * kWarpgroup);
  release_output_buffer();
}

template <typename T, int D, int RANK>
__global__ void __launch_bounds__(kThreads, 1) forward_kernel(const AttentionParams p, const TileShape shape,
                                                              const KeyTiling kt, int64_t pairs,
                                                              const __grid_constant__ ForwardMaps maps) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using L = Smem<T, D>;
  unsigned char* smem = aligned_shared_memory();
  T* sQ = reinterpret_cast<T*>(smem + L::kQ);
  T* sK = reinterpret_cast<T*>(smem + L::kK);
  T* sV = reinterpret_cast<T*>(smem + L::kV);
  uint64_t* below = reinterpret_cast<uint64_t*>(smem + L::kBelow);
  uint64_t* q_full = reinterpret_cast<uint64_t*>(smem + L::kBarriers);
  uint64_t* q_empty = q_full + 2;
  uint64_t* full = q_empty + 2;
  uint64_t* empty = full + L::kRing;
  uint64_t* plan_full = empty + L::kRing;
  uint64_t* plan_empty = plan_full + kPlanStages;
  PairPlan* plans = reinterpret_cast<PairPlan*>(smem + L::kPlans);

  if (threadIdx.x == 0) {
    // Full barriers: the producer's one arrival plus the copies' bytes; empty ones: every consumer.
    for (int b = 0; b < 2; ++b) {
      Barrier::init(&q_full[b], 1);
      Barrier::init(&q_empty[b], kConsumers * kWarpgroup);
    }
    for (int s = 0; s < L::kRing; ++s) {
      Barrier::init(&full[s], 1);
      Barrier::init(&empty[s], kConsumers * kWarpgroup);
    }
    for (int s = 0; s < kPlanStages; ++s) {
      Barrier::init(&plan_full[s], kPlanningWarps * 32);
      Barrier::init(&plan_empty[s], kConsumers * kWarpgroup);
    }
    cute::prefetch_tma_descriptor(&maps.query);
    cute::prefetch_tma_descriptor(&maps.key);
    cute::prefetch_tma_descriptor(&maps.value);
    cute::prefetch_tma_descriptor(&maps.out);
  }
  fill_prefix_masks(below, kt);
  cutlass::arch::fence_barrier_init();
  __syncthreads();

  if (threadIdx.x < kWarpgroup) {
    cutlass::arch::warpgroup_reg_dealloc<kProducerRegisters>();
    if (threadIdx.x == 0) produce<T, D>(p, shape, kt, pairs, maps, sQ, sK, sV, q_full, q_empty, full, empty);
    const int warp = threadIdx.x / 32;
    if (warp == 1 || warp == 2) plan_pairs(p, shape, kt, pairs, warp - 1, plans, plan_full, plan_empty);
  } else {
    cutlass::arch::warpgroup_reg_alloc<kConsumerRegisters>();
    consume<T, D, RANK>(p, kt, &maps.out, sQ, sK, sV, below, plans, plan_full, plan_empty, q_full, q_empty, full, empty);
  }
#endif
}

// Everything a launch needs that depends on the call only (tiles and tensor maps), or why the
// Hopper kernel cannot take the call.
struct Plan {
  TileShape shape;
  KeyTiling kt;
  int64_t pairs;
  ForwardMaps maps;
};

std::string plan(const AttentionParams& p, Plan& out) {
  if (!choose_pair_tiling(p, false, out.shape, out.kt))
    return "no 64-token key tile fits a copy box at this dilation (tile * dilation <= 256)";
  out.pairs = count_tiles(p, out.shape, p.heads);
  if (out.pairs > kMaxCtas) return "the problem needs more than 2^31 - 1 pair tiles";
  const TileShape half = half_shape(out.shape);
  std::string bad = encode_token_map(out.maps.query, "query", p, p.query, p.heads, half.n);
  if (bad.empty()) bad = encode_token_map(out.maps.out, "out", p, p.out, p.heads, half.n);
  if (bad.empty()) bad = encode_token_map(out.maps.key, "key", p, p.key, p.kv_heads, out.kt.n);
  if (bad.empty()) bad = encode_token_map(out.maps.value, "value", p, p.value, p.kv_heads, out.kt.n);
  return bad;
}

template <typename T, int D>
std::string launch(const AttentionParams& p, const Plan& plan) {
  const int rank = effective_rank(p);
  auto kernel = rank == 1   ? forward_kernel<T, D, 1>
                : rank == 2 ? forward_kernel<T, D, 2>
                            : forward_kernel<T, D, 3>;
  return launch_persistent(p, kernel, Smem<T, D>::kLaunchBytes, plan.pairs, plan.shape, plan.kt, plan.pairs, plan.maps);
}

}  // namespace
}  // namespace sm90

std::string forward_sm90(const AttentionParams& p, std::string& refusal) {
  sm90::Plan plan;
  refusal = sm90::plan(p, plan);
  if (!refusal.empty()) return {};
  return dispatch_dtype_dim(p, [&](auto dtype_tag, auto dim_tag) {
    using T = typename decltype(dtype_tag)::type;
    constexpr int D = decltype(dim_tag)::value;
    return sm90::launch<T, D>(p, plan);
  });
}

}  // namespace haloattn
