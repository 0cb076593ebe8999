// Fused backward pass for Hopper (sm_90a): persistent, warp-specialised, warpgroup MMA, TMA;
// deterministic (no atomics), in two passes that share one kernel template:
//   * query-major (dQ): a pair tile of 128 queries owns Q and dO and streams the key tiles of its
//     union key box (K, V), exactly the forward kernel's walk;
//   * key-major (dK, dV): a pair tile of 128 keys owns K and V and streams, for every query head
//     of its KV head's group, the query tiles (Q, dO and the queries' LSE and delta) of the box of
//     queries that see it (the inverse rule).
// Per streamed tile each consumer warpgroup (64 own rows) computes, with A = its own tiles and
// B = the streamed ones (all in 128-byte-swizzled shared memory):
//   S = A0 B0^T and dP = A1 B1^T                      (both K-major: the forward's Q K^T)
//   P = exp(S scale - LSE), dS = P (dP - delta)         (per row or, key-major, per column)
//   key-major: acc1 += P B1 (dV += P^T dO)              (P from registers, B MN-major: the
//   acc0 += dS B0 (dQ += dS K, or dK += dS^T Q)          forward's P V)
// so dQ = scale acc0, dK = scale acc0 and dV = acc1. The query-major pass also works out each
// query's delta = rowsum(dO O) - dLSE (it holds the row's dO) and writes it for the key-major
// pass, which runs after it. One producer thread issues the copies into a ring of stages
// ("full"/"empty" mbarriers as in the forward); key-major, the producer warpgroup's other three
// warps take turns gathering the streamed queries' LSE (log2 units) and delta into the stage
// beside them.
#include <cuda_runtime.h>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "attention_params.h"
#include "fragment_sources.cuh"
#include "kernel_launch.h"
#include "key_tiles.cuh"
#include "mma_fragments.cuh"
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

// The producer warpgroup's warps that gather LSE and delta (key-major), taking the stages in
// turn: one warp waits a round trip to memory per stage, which at 2-D 31x31 (Nsight Compute's
// stall sampling) left the consumers waiting on the stage's full barrier while the copy thread,
// its copies long done, waited for an empty stage.
constexpr int kFirstStatsWarp = 1;
constexpr int kStatsWarps = kWarpgroup / 32 - kFirstStatsWarp;

// Registers per thread after the role split. The consumers hold S, dP, one or two gradient
// accumulators and dS fragments: key-major at head dim 128 that is 192 registers before
// addresses, so the producer warpgroup keeps only 24 (its copies' and the statistics'
// bookkeeping then spills to L1). Key-major at head dim 64 the consumers need far fewer and the
// statistics warps, which spilled at 24, keep 56: that pass's device time fell from 0.84 to
// 0.72 ms (2-D 31x31, H100). The query-major pass measured the same either way and keeps 24.
template <bool KEY_MAJOR, int D>
struct RegisterSplit {
  static constexpr bool kRoomy = KEY_MAJOR && D <= 64;
  static constexpr int kProducer = kRoomy ? 56 : 24;
  static constexpr int kConsumer = kRoomy ? 224 : 240;
  static_assert(register_split_fits(kProducer, kConsumer), "the register split exceeds the launch allocation");
};

// The ring holds four streamed tiles at head dim 128: a tile costs four (key-major) or three
// 64 x 64 x D products per consumer, two to three times a forward tile, so four stages hide the
// copies' latency, and a fifth does not fit beside the own tiles. At head dim 64 it holds eight,
// as the forward's does: both consumers release every stage, so the ring's depth bounds how far
// one half may run ahead of the other.
template <int D>
constexpr int backward_stages() { return D <= 64 ? 2 * kStages : kStages; }

// The tensor maps of one pass: own[0], own[1] are Q, dO (query-major) or K, V (key-major) with a
// half tile's box; stream[0], stream[1] are K, V or Q, dO with the partner tile's box.
struct BackwardMaps {
  CUtensorMap own[2], stream[2];
};

template <typename T, int D, bool KEY_MAJOR>
struct Smem {
  static constexpr int kOwnElems = kHalfRows * D;   // one half's [64][D] tile of one operand
  static constexpr int kTileElems = kChunk * D;     // one streamed [64][D] tile of one operand
  static constexpr size_t kTileBytes = kTileElems * sizeof(T);
  static constexpr int kRing = backward_stages<D>();
  static constexpr size_t kOwn = 0;                                                 // [operand][half]
  static constexpr size_t kStream = kOwn + 2 * kConsumers * kOwnElems * sizeof(T);  // [operand][stage]
  static constexpr size_t kStats = kStream + 2 * kRing * kTileBytes;              // [stage][kChunk] float2
  static constexpr size_t kBelow = kStats + (KEY_MAJOR ? kRing * kChunk * sizeof(float2) : 0);
  static constexpr size_t kBarriers = kBelow + kMaxRank * kMaskEntries * sizeof(uint64_t);
  // own full, own empty, stream full[stages], stream empty[stages].
  static constexpr int kBarrierCount = 2 + 2 * kRing;
  static constexpr size_t kBytes = kBarriers + kBarrierCount * sizeof(uint64_t);
  static constexpr size_t kLaunchBytes = kBytes + 1024;  // tiles start 1024-byte aligned
  static_assert(kTileBytes % 1024 == 0, "tiles 1024-aligned");
  static_assert(kLaunchBytes <= 227 * 1024, "more shared memory than a Hopper CTA may have");
};

// The streamed tiles' head for step `hs` of a pair of (KV) head `head`: key-major walks the
// query heads of the KV head's group, query-major reads its query head's KV head.
__device__ inline int streamed_head(const AttentionParams& p, int head, int hs, bool key_major) {
  const int group = div_nonneg(p.heads, p.kv_heads);
  return key_major ? head * group + hs : div_nonneg(head, group);
}

__device__ inline int head_steps(const AttentionParams& p, bool key_major) {
  return key_major ? p.heads / p.kv_heads : 1;
}

template <typename T, int D, bool KEY_MAJOR>
__device__ inline void produce(const AttentionParams& p, const TileShape& shape, const KeyTiling& kt, int64_t pairs,
                               const BackwardMaps& maps, T* own, T* stream, uint64_t* own_full, uint64_t* own_empty,
                               uint64_t* full, uint64_t* empty) {
  using L = Smem<T, D, KEY_MAJOR>;
  const TileShape half = half_shape(shape);
  const int own_rows = half.n[0] * half.n[1] * half.n[2];
  // Neighbouring pairs re-read most of each other's partner tiles from L2: keep them there.
  const uint64_t keep = static_cast<uint64_t>(cute::TMA::CacheHintSm90::EVICT_LAST);
  const uint64_t once = static_cast<uint64_t>(cute::TMA::CacheHintSm90::EVICT_FIRST);
  int chunk_count = 0, pair_count = 0;
  for (int64_t pair = blockIdx.x; pair < pairs; pair += gridDim.x) {
    const PairTiles t = pair_tiles(p, shape, kt, pair, KEY_MAJOR);
    const TileWork& w = t.work;
    if (w.empty) continue;
    // The consumers release the own tiles once their fragments are in registers, or else after
    // the pair's last product (consume's kOwnInRegisters).
    if (pair_count >= 1) Barrier::wait(own_empty, (pair_count - 1) & 1);
    const int halves = tile_half(w, shape, 1).work.empty ? 1 : 2;
    TxBarrier::arrive_and_expect_tx(own_full, 2 * halves * own_rows * D * sizeof(T));
    for (int h = 0; h < halves; ++h) {
      const TileHalf th = tile_half(w, shape, h);
      for (int operand = 0; operand < 2; ++operand)
        copy_box<D>(&maps.own[operand], own_full, own + (operand * kConsumers + h) * L::kOwnElems, kHalfRows, p, w,
                    w.head, th.work.x0, once);
    }
    for (int hs = 0; hs < head_steps(p, KEY_MAJOR); ++hs) {
      const int head = streamed_head(p, w.head, hs, KEY_MAJOR);
      TileCursor cursor{{0, 0, 0}};
      for (int c = 0; c < t.chunks; ++c, ++chunk_count) {
        const int n = chunk_count, stage = stage_of<L::kRing>(n);
        if (n >= L::kRing) Barrier::wait(&empty[stage], phase_of<L::kRing>(n) ^ 1);
        TxBarrier::arrive_and_expect_tx(&full[stage], 2 * L::kTileBytes);
        int x[kMaxRank];
        for (int a = 0; a < kMaxRank; ++a) x[a] = t.start[a] + cursor.i[a] * kt.n[a];
        for (int operand = 0; operand < 2; ++operand)
          copy_box<D>(&maps.stream[operand], &full[stage], stream + (operand * L::kRing + stage) * L::kTileElems, kChunk,
                      p, w, head, x, keep);
        step_tile(cursor, t.tiles);
      }
    }
    ++pair_count;
  }
}

// A row's LSE in log2 units, the P = exp2(S scale log2e - LSE log2e) of both passes use. A row
// that attends nothing has LSE -inf: +inf makes every one of its P exactly 0.
__device__ __forceinline__ float lse_log2(float lse) { return lse == -INFINITY ? INFINITY : lse * kLog2e; }

// Key-major only: the statistics warps write each streamed query tile's [LSE in log2 units,
// delta] per token into the stage's statistics, warp `turn` taking every kStatsWarps-th stage,
// then arrive on the stage's full barrier (the arrival releases the writes to the consumers that
// wait there). Tokens outside the grid get finite values; their scores are masked.
template <bool KEY_MAJOR, int RING>
__device__ inline void gather_stats(const AttentionParams& p, const TileShape& shape, const KeyTiling& kt,
                                    int64_t pairs, int turn, float2* stats, uint64_t* full, uint64_t* empty) {
  const int lane = threadIdx.x % 32;
  const float* lse = reinterpret_cast<const float*>(p.lse);
  const float* delta = reinterpret_cast<const float*>(p.delta);
  const int64_t tokens = grid_tokens(p);
  // Each lane's two tokens of a tile, as offsets from the tile's origin: the same for every tile.
  constexpr int kPerLane = kChunk / 32;
  int offset[kPerLane][kMaxRank];
#pragma unroll
  for (int r = 0; r < kPerLane; ++r) {
    const int j = lane + 32 * r;
    offset[r][0] = j / (kt.n[1] * kt.n[2]);
    offset[r][1] = j / kt.n[2] % kt.n[1];
    offset[r][2] = j % kt.n[2];
  }
  int chunk_count = 0;
  for (int64_t pair = blockIdx.x; pair < pairs; pair += gridDim.x) {
    const PairTiles t = pair_tiles(p, shape, kt, pair, KEY_MAJOR);
    const TileWork& w = t.work;
    if (w.empty) continue;
    for (int hs = 0; hs < head_steps(p, KEY_MAJOR); ++hs) {
      const int head = streamed_head(p, w.head, hs, KEY_MAJOR);
      TileCursor cursor{{0, 0, 0}};
      for (int c = 0; c < t.chunks; ++c, ++chunk_count, step_tile(cursor, t.tiles)) {
        const int n = chunk_count, stage = stage_of<RING>(n);
        if (n % kStatsWarps != turn) continue;
        // Both rows' loads are issued before either is used (and before the wait for the
        // stage), so a stage costs one round trip to memory, not two.
        int64_t rows[kPerLane];
        bool inside[kPerLane];
#pragma unroll
        for (int r = 0; r < kPerLane; ++r) {
          int x[kMaxRank];
          inside[r] = true;
          for (int a = 0; a < kMaxRank; ++a) {
            x[a] = t.start[a] + cursor.i[a] * kt.n[a] + offset[r][a];
            inside[r] = inside[r] && x[a] >= 0 && x[a] < w.group_len[a];
          }
          rows[r] = inside[r] ? (w.batch * tokens + token_index(p, w, x)) * p.heads + head : 0;
        }
        float lse_of[kPerLane], delta_of[kPerLane];
#pragma unroll
        for (int r = 0; r < kPerLane; ++r) {
          lse_of[r] = inside[r] ? lse[rows[r]] : 0.f;
          delta_of[r] = inside[r] ? delta[rows[r]] : 0.f;
        }
        if (n >= RING) Barrier::wait(&empty[stage], phase_of<RING>(n) ^ 1);
#pragma unroll
        for (int r = 0; r < kPerLane; ++r) {
          stats[stage * kChunk + lane + 32 * r] = make_float2(lse_log2(lse_of[r]), delta_of[r]);
        }
        Barrier::arrive(&full[stage]);
      }
    }
  }
}

struct RowStats {
  float lse2;   // the row's LSE in log2 units (+inf where it is -inf: every P of the row is 0)
  float delta;  // rowsum(dO O) - dLSE
};

// Query-major: the statistics of own row `row` (group coordinates x) of a half, whose dO tile
// `d_o` (128-byte-swizzled, [64][D]) is in shared memory. The four threads of a quad (t = 0..3)
// share the row: each sums dO * O over every fourth 16-byte piece (O read from global memory),
// then the quad adds; thread 0 writes delta for the key-major pass. Rows past the grid get 0.
template <typename T, int D>
__device__ inline RowStats own_row_stats(const AttentionParams& p, const TileWork& w, const int (&x)[kMaxRank],
                                         bool inside, const T* d_o, int row, int t) {
  float sum = 0.f;
  int64_t index = 0;
  if (inside) {
    index = lse_index(p, w, x);
    const T* o = reinterpret_cast<const T*>(p.out.ptr) + w.batch * p.out.batch_stride + w.head * p.out.head_stride +
                 token_offset(p, p.out, w, x);
#pragma unroll
    for (int piece = t; piece < D / 8; piece += 4) {
      const uint4 ov = *reinterpret_cast<const uint4*>(o + piece * 8);
      const uint4 dv = *reinterpret_cast<const uint4*>(d_o + swizzled_element<kHalfRows>(row, piece));
      const uint32_t os[4] = {ov.x, ov.y, ov.z, ov.w}, ds[4] = {dv.x, dv.y, dv.z, dv.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float2 a = unpack2<T>(os[i]), b = unpack2<T>(ds[i]);
        sum = fmaf(a.x, b.x, fmaf(a.y, b.y, sum));
      }
    }
  }
  sum = quad_sum(sum);  // every lane of the quad takes part (the shuffles need the whole warp)
  if (!inside) return {0.f, 0.f};
  const float* grad_lse = reinterpret_cast<const float*>(p.grad_lse);
  const float delta = sum - (grad_lse ? grad_lse[index] : 0.f);
  if (t == 0) reinterpret_cast<float*>(p.delta)[index] = delta;
  const float lse = reinterpret_cast<const float*>(p.lse)[index];
  return {lse_log2(lse), delta};
}

template <typename T, int D, int RANK, bool KEY_MAJOR>
__device__ inline void consume(const AttentionParams& p, const TileShape& shape, const KeyTiling& kt, int64_t pairs,
                               const T* own, const T* stream, const float2* stats, const uint64_t* below,
                               uint64_t* own_full, uint64_t* own_empty, uint64_t* full, uint64_t* empty) {
  using L = Smem<T, D, KEY_MAJOR>;
  constexpr int kSRegs = kChunk / 2;  // S (and dP) accumulators per thread: 64 x kChunk over 128 threads
  constexpr int kAccRegs = D / 2;     // one gradient accumulator, 64 x D
  constexpr int kPartnerTiles = kChunk / 8;
  constexpr int kKSteps = kChunk / 16;
  // S and dP read their own operand (the 64 own rows) from registers where they fit beside the
  // accumulators: query-major (one 64 x D accumulator) and key-major at head dim 64. Read from
  // shared memory, both operands of an m64n64k16 product take all of its bandwidth (128 bytes a
  // cycle at the tensor cores' rate), beside the copies' writes and the other products' reads.
  // Key-major at head dim 128, S, dP, dK and dV fill 192 of the 240 registers: no room.
  constexpr bool kOwnInRegisters = !KEY_MAJOR || D <= 64;
  const int half = threadIdx.x / kWarpgroup - 1;
  const int tid = threadIdx.x % kWarpgroup;
  const int warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;
  const float scale_log2 = p.scale * kLog2e;
  const int64_t tokens = grid_tokens(p);
  const T* a0 = own + (0 * kConsumers + half) * L::kOwnElems;
  const T* a1 = own + (1 * kConsumers + half) * L::kOwnElems;
  int chunk_count = 0, pair_count = 0;

  for (int64_t pair = blockIdx.x; pair < pairs; pair += gridDim.x) {
    const PairTiles tiles = pair_tiles(p, shape, kt, pair, KEY_MAJOR);
    if (tiles.work.empty) continue;
    const TileWork& w = tiles.work;
    const TileHalf h = tile_half(w, shape, half);
    const HalfTiles mine = half_tiles(p, tiles, h, kt, KEY_MAJOR);

    // The two own rows this thread accumulates and their partner windows (group coordinates).
    const int row_a = warp * 16 + g, row_b = row_a + 8;
    int x_a[kMaxRank], x_b[kMaxRank];
    const bool inside_a = row_a < h.rows && tile_row_coords(w, shape, h.first_row + row_a, x_a);
    const bool inside_b = row_b < h.rows && tile_row_coords(w, shape, h.first_row + row_b, x_b);
    const RowWindow win_a = query_window(p, w, x_a, inside_a, KEY_MAJOR);
    const RowWindow win_b = query_window(p, w, x_b, inside_b, KEY_MAJOR);
    float acc0[kAccRegs], acc1[KEY_MAJOR ? kAccRegs : 1];
#pragma unroll
    for (int i = 0; i < kAccRegs; ++i) acc0[i] = 0.f;
#pragma unroll
    for (int i = 0; i < (KEY_MAJOR ? kAccRegs : 1); ++i) acc1[i] = 0.f;
    Barrier::wait(own_full, pair_count & 1);

    // Query-major: the rows' own statistics, LSE read and delta = rowsum(dO O) - dLSE worked out
    // here from the dO tile and written for the key-major pass (which reads the columns' from
    // its stages), so no separate pass over O and dO runs.
    float lse2_a = 0.f, lse2_b = 0.f, delta_a = 0.f, delta_b = 0.f;
    if constexpr (!KEY_MAJOR) {
      const RowStats a = own_row_stats<T, D>(p, w, x_a, inside_a, a1, row_a, t);
      const RowStats b = own_row_stats<T, D>(p, w, x_b, inside_b, a1, row_b, t);
      lse2_a = a.lse2, delta_a = a.delta, lse2_b = b.lse2, delta_b = b.delta;
    }
    // Where the registers allow, the own tiles move to registers once (A fragments of S and
    // dP), and their buffers go back to the producer at once, so it loads the next pair's while
    // this one walks (see kOwnInRegisters).
    uint32_t a0f[kOwnInRegisters ? D / 16 : 1][4], a1f[kOwnInRegisters ? D / 16 : 1][4];
    if constexpr (kOwnInRegisters) {
#pragma unroll
      for (int ks = 0; ks < D / 16; ++ks) {
        const TileCoord at = a_source(lane, 16 * warp, 16 * ks);
        ldmatrix_x4(a0f[ks], a0 + swizzled_element<kHalfRows>(at.row, at.col / 8));
        ldmatrix_x4(a1f[ks], a1 + swizzled_element<kHalfRows>(at.row, at.col / 8));
      }
      Barrier::arrive(own_empty);
    }

    for (int hs = 0; hs < head_steps(p, KEY_MAJOR); ++hs) {
      TileCursor cursor{{0, 0, 0}};
      for (int c = 0; c < tiles.chunks; ++c, ++chunk_count, step_tile(cursor, tiles.tiles)) {
        const int n = chunk_count, stage = stage_of<L::kRing>(n);
        Barrier::wait(&full[stage], phase_of<L::kRing>(n));
        if (!tile_in(cursor, mine.first, mine.end)) {  // outside this half's partner box
          Barrier::arrive(&empty[stage]);
          continue;
        }
        const T* b0 = stream + (0 * L::kRing + stage) * L::kTileElems;
        const T* b1 = stream + (1 * L::kRing + stage) * L::kTileElems;
        const float2* col_stats = stats + stage * kChunk;

        float s[kSRegs], dp[kSRegs];
        cute::warpgroup_arrive();
#pragma unroll
        for (int ks = 0; ks < D / 16; ++ks) {
          if constexpr (kOwnInRegisters)
            mma_rs_k<T, kChunk>(a0f[ks], k_major_descriptor<T, kChunk>(b0, ks), s, ks > 0);
          else
            mma_ss<T, kChunk>(k_major_descriptor<T, kHalfRows>(a0, ks), k_major_descriptor<T, kChunk>(b0, ks), s,
                              ks > 0);
        }
        cute::warpgroup_commit_batch();
#pragma unroll
        for (int ks = 0; ks < D / 16; ++ks) {
          if constexpr (kOwnInRegisters)
            mma_rs_k<T, kChunk>(a1f[ks], k_major_descriptor<T, kChunk>(b1, ks), dp, ks > 0);
          else
            mma_ss<T, kChunk>(k_major_descriptor<T, kHalfRows>(a1, ks), k_major_descriptor<T, kChunk>(b1, ks), dp,
                              ks > 0);
        }
        cute::warpgroup_commit_batch();

        // Partner tiles inside this half's common window need no mask. On grids of rank 2 and
        // 3 their mask (all ones) is built anyway: with no branch in the loop ptxas schedules
        // the two products' waits and the exponentials better and the key-major loop's spills
        // go, which gains more than those masks cost (the backward 1.05-1.16x on every
        // benchmark row of rank 2 and 3, also where no tile is masked). On 1-D, with 6 % of the
        // tiles masked, the branch was 1.02x faster (RESULTS.md, 2026-12-02), but with the own
        // fragments in registers ptxas 13.0 gave the 1-D kernels' P and dS fragments the own
        // fragments' registers across that branch (at head dim 64; the next tile's S and dP
        // then read P and dS: wrong gradients), so there every tile is masked too.
        // tests/test_cuda_build.py checks the SASS for such reuse.
        constexpr bool kMaskEveryTile = RANK >= 2 || kOwnInRegisters;
        uint64_t mask_a = ~uint64_t{0}, mask_b = ~uint64_t{0};
        if (kMaskEveryTile || !tile_in(cursor, mine.full_lo, mine.full_hi)) {
          int origin[kMaxRank];
#pragma unroll
          for (int a = 0; a < kMaxRank; ++a) origin[a] = tiles.start[a] + cursor.i[a] * kt.n[a];
          // This thread's scores are partners 8j + 2t + e: shift its bits down to 8j + e.
          mask_a = row_mask<RANK>(win_a, origin, kt, below) >> (2 * t);
          mask_b = row_mask<RANK>(win_b, origin, kt, below) >> (2 * t);
        }
        cute::warpgroup_wait<1>();  // S is ready
        fence_registers(s);
        // P = exp2(S scale log2e - LSE log2e), zero outside the windows (the mask applies after
        // the exponential, so any sign of the scale is handled).
#pragma unroll
        for (int j = 0; j < kPartnerTiles; ++j) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float l_a = KEY_MAJOR ? col_stats[8 * j + 2 * t + e].x : lse2_a;
            const float l_b = KEY_MAJOR ? col_stats[8 * j + 2 * t + e].x : lse2_b;
            const float p_a = fast_exp2(fmaf(s[4 * j + e], scale_log2, -l_a));
            const float p_b = fast_exp2(fmaf(s[4 * j + 2 + e], scale_log2, -l_b));
            s[4 * j + e] = (mask_a >> (8 * j + e)) & 1 ? p_a : 0.f;
            s[4 * j + 2 + e] = (mask_b >> (8 * j + e)) & 1 ? p_b : 0.f;
          }
        }
        cute::warpgroup_wait<0>();  // dP is ready
        fence_registers(dp);
        // dS = P (dP - delta), formed in dP's registers while P stays in S's: at head dim 128
        // key-major the consumer has no registers for P's fragments beside S, dP and both
        // accumulators, so both products are issued only once dS is done.
#pragma unroll
        for (int j = 0; j < kPartnerTiles; ++j) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float d_a = KEY_MAJOR ? col_stats[8 * j + 2 * t + e].y : delta_a;
            const float d_b = KEY_MAJOR ? col_stats[8 * j + 2 * t + e].y : delta_b;
            dp[4 * j + e] = s[4 * j + e] * (dp[4 * j + e] - d_a);
            dp[4 * j + 2 + e] = s[4 * j + 2 + e] * (dp[4 * j + 2 + e] - d_b);
          }
        }
        uint32_t pf[kKSteps][4], dsf[kKSteps][4];
        if constexpr (KEY_MAJOR) accumulator_to_fragments<T>(s, pf);
        accumulator_to_fragments<T>(dp, dsf);
        // acc1 += P B1 (dV += P^T dO, key-major) and acc0 += dS B0.
        fence_registers(acc0);
        if constexpr (KEY_MAJOR) fence_registers(acc1);
        cute::warpgroup_arrive();
        if constexpr (KEY_MAJOR) {
#pragma unroll
          for (int kk = 0; kk < kKSteps; ++kk) mma_rs<T, D>(pf[kk], mn_major_descriptor<T, kChunk>(b1, kk), acc1);
        }
#pragma unroll
        for (int kk = 0; kk < kKSteps; ++kk) mma_rs<T, D>(dsf[kk], mn_major_descriptor<T, kChunk>(b0, kk), acc0);
        cute::warpgroup_commit_batch();
        cute::warpgroup_wait<0>();  // every product of this stage is done with it
        fence_registers(acc0);
        fence_fragments(dsf);
        if constexpr (KEY_MAJOR) {
          fence_registers(acc1);
          fence_fragments(pf);
        }
        if constexpr (kOwnInRegisters) {
          // The own fragments stay live and unchanged from tile to tile (see kMaskEveryTile for
          // what ptxas 13.0 did to them beside a branch).
          fence_fragments(a0f);
          fence_fragments(a1f);
        }
        Barrier::arrive(&empty[stage]);
      }
    }
    if constexpr (!kOwnInRegisters) Barrier::arrive(own_empty);
    ++pair_count;

    // dQ = scale acc0 (query-major); dK = scale acc0 and dV = acc1 (key-major).
    const TokenTensor& out0 = KEY_MAJOR ? p.grad_key : p.grad_query;
    if (inside_a)
      store_values<T, kAccRegs / 4>(p, out0, w, x_a, t, [&](int j) {
        return make_float2(acc0[4 * j + 0] * p.scale, acc0[4 * j + 1] * p.scale);
      });
    if (inside_b)
      store_values<T, kAccRegs / 4>(p, out0, w, x_b, t, [&](int j) {
        return make_float2(acc0[4 * j + 2] * p.scale, acc0[4 * j + 3] * p.scale);
      });
    if constexpr (KEY_MAJOR) {
      if (inside_a)
        store_values<T, kAccRegs / 4>(p, p.grad_value, w, x_a, t,
                                      [&](int j) { return make_float2(acc1[4 * j + 0], acc1[4 * j + 1]); });
      if (inside_b)
        store_values<T, kAccRegs / 4>(p, p.grad_value, w, x_b, t,
                                      [&](int j) { return make_float2(acc1[4 * j + 2], acc1[4 * j + 3]); });
    }
  }
}

template <typename T, int D, int RANK, bool KEY_MAJOR>
__global__ void __launch_bounds__(kThreads, 1) backward_kernel(const AttentionParams p, const TileShape shape,
                                                               const KeyTiling kt, int64_t pairs,
                                                               const __grid_constant__ BackwardMaps maps) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using L = Smem<T, D, KEY_MAJOR>;
  unsigned char* smem = aligned_shared_memory();
  T* own = reinterpret_cast<T*>(smem + L::kOwn);
  T* stream = reinterpret_cast<T*>(smem + L::kStream);
  float2* stats = reinterpret_cast<float2*>(smem + L::kStats);
  uint64_t* below = reinterpret_cast<uint64_t*>(smem + L::kBelow);
  uint64_t* own_full = reinterpret_cast<uint64_t*>(smem + L::kBarriers);
  uint64_t* own_empty = own_full + 1;
  uint64_t* full = own_empty + 1;
  uint64_t* empty = full + L::kRing;

  if (threadIdx.x == 0) {
    // Full barriers: the copy thread's arrival plus its bytes (and key-major one stats warp's);
    // empty ones: every consumer thread.
    Barrier::init(own_full, 1);
    Barrier::init(own_empty, kConsumers * kWarpgroup);
    for (int s = 0; s < L::kRing; ++s) {
      Barrier::init(&full[s], KEY_MAJOR ? 1 + 32 : 1);
      Barrier::init(&empty[s], kConsumers * kWarpgroup);
    }
    for (int i = 0; i < 2; ++i) {
      cute::prefetch_tma_descriptor(&maps.own[i]);
      cute::prefetch_tma_descriptor(&maps.stream[i]);
    }
  }
  fill_prefix_masks(below, kt);
  cutlass::arch::fence_barrier_init();
  __syncthreads();

  if (threadIdx.x < kWarpgroup) {
    cutlass::arch::warpgroup_reg_dealloc<RegisterSplit<KEY_MAJOR, D>::kProducer>();
    if (threadIdx.x == 0)
      produce<T, D, KEY_MAJOR>(p, shape, kt, pairs, maps, own, stream, own_full, own_empty, full, empty);
    else if (KEY_MAJOR && threadIdx.x / 32 >= kFirstStatsWarp)
      gather_stats<KEY_MAJOR, L::kRing>(p, shape, kt, pairs, threadIdx.x / 32 - kFirstStatsWarp, stats, full, empty);
  } else {
    cutlass::arch::warpgroup_reg_alloc<RegisterSplit<KEY_MAJOR, D>::kConsumer>();
    consume<T, D, RANK, KEY_MAJOR>(p, shape, kt, pairs, own, stream, stats, below, own_full, own_empty, full, empty);
  }
#endif
}

// Tiles and tensor maps of one pass, or why the Hopper kernel cannot take the call.
struct Plan {
  TileShape shape;
  KeyTiling kt;
  int64_t pairs;
  BackwardMaps maps;
};

std::string plan(const AttentionParams& p, bool key_major, Plan& out) {
  if (!choose_pair_tiling(p, key_major, out.shape, out.kt))
    return "no 64-token partner tile fits a copy box at this dilation (tile * dilation <= 256)";
  out.pairs = count_tiles(p, out.shape, key_major ? p.kv_heads : p.heads);
  if (out.pairs > kMaxCtas) return "the problem needs more than 2^31 - 1 pair tiles";
  const TileShape half = half_shape(out.shape);
  const TokenTensor& own0 = key_major ? p.key : p.query;
  const TokenTensor& own1 = key_major ? p.value : p.grad_out;
  const TokenTensor& stream0 = key_major ? p.query : p.key;
  const TokenTensor& stream1 = key_major ? p.grad_out : p.value;
  const int own_heads = key_major ? p.kv_heads : p.heads, stream_heads = key_major ? p.heads : p.kv_heads;
  std::string bad = encode_token_map(out.maps.own[0], key_major ? "key" : "query", p, own0, own_heads, half.n);
  if (bad.empty()) bad = encode_token_map(out.maps.own[1], key_major ? "value" : "grad_out", p, own1, own_heads, half.n);
  if (bad.empty()) bad = encode_token_map(out.maps.stream[0], key_major ? "query" : "key", p, stream0, stream_heads, out.kt.n);
  if (bad.empty())
    bad = encode_token_map(out.maps.stream[1], key_major ? "grad_out" : "value", p, stream1, stream_heads, out.kt.n);
  return bad;
}

template <typename T, int D, bool KEY_MAJOR>
std::string launch(const AttentionParams& p, const Plan& plan) {
  const int rank = effective_rank(p);
  auto kernel = rank == 1   ? backward_kernel<T, D, 1, KEY_MAJOR>
                : rank == 2 ? backward_kernel<T, D, 2, KEY_MAJOR>
                            : backward_kernel<T, D, 3, KEY_MAJOR>;
  return launch_persistent(p, kernel, Smem<T, D, KEY_MAJOR>::kLaunchBytes, plan.pairs, plan.shape, plan.kt, plan.pairs,
                           plan.maps);
}

}  // namespace
}  // namespace sm90

std::string backward_sm90(const AttentionParams& p, std::string& refusal) {
  sm90::Plan query_major, key_major;
  refusal = sm90::plan(p, false, query_major);
  if (refusal.empty()) refusal = sm90::plan(p, true, key_major);
  if (!refusal.empty()) return {};
  return dispatch_dtype_dim(p, [&](auto dtype_tag, auto dim_tag) {
    using T = typename decltype(dtype_tag)::type;
    constexpr int D = decltype(dim_tag)::value;
    std::string error = sm90::launch<T, D, false>(p, query_major);
    return error.empty() ? sm90::launch<T, D, true>(p, key_major) : error;
  });
}

}  // namespace haloattn
