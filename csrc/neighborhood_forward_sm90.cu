// Fused forward pass for Hopper (sm_90a): persistent, warp-specialised, warpgroup MMA.
//
// A CTA stays on its SM and takes pair tiles (pair_tiles.cuh: two 64-query tiles of one (batch,
// head, dilation group)) in turn. Three warpgroups split the work:
//   * the producer copies each pair's queries (double-buffered, so the next pair's load overlaps
//     this one's tail) and the union key box, in flat 64-key chunks, into a ring of shared-memory
//     stages (cp.async into the 128-byte-swizzled layout wgmma reads; rows are gathered by box
//     coordinates, so any box shape, dilation and edge works), and publishes each stage on its
//     "full" mbarrier once the copies have landed;
//   * each consumer warpgroup owns one half (64 queries) and, for the chunks that overlap its
//     own key box, computes S = Q K^T (wgmma, both from smem), masks, runs the online softmax in
//     registers and accumulates O += P V (wgmma, P from registers); every chunk is freed on its
//     "empty" mbarrier by both consumers, so the producer runs up to the ring's depth ahead.
// While one consumer runs its softmax the other's tensor-core work proceeds, and the copies of
// one pair overlap the other pair's math and epilogue.
#include <cuda_runtime.h>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>

#include <cmath>
#include <string>

#include "attention_params.h"
#include "box_cursor.cuh"
#include "box_windows.cuh"
#include "kernel_launch.h"
#include "mma_fragments.cuh"
#include "pair_tiles.cuh"
#include "row_output.cuh"
#include "row_windows.cuh"
#include "token_tiles.cuh"
#include "wgmma_ops.cuh"

namespace haloattn {
namespace sm90 {
namespace {

constexpr int kHalfRows = 64;    // queries per consumer warpgroup (the M of one wgmma)
constexpr int kConsumers = 2;    // warpgroups, one per half of a pair tile
constexpr int kWarpgroup = 128;  // threads
constexpr int kThreads = kWarpgroup * (1 + kConsumers);

// Registers per thread after the role split (setmaxnreg): consumers hold S, O and two P
// buffers. The split only moves the registers the CTA was launched with (kLaunchRegisters per
// thread, the __launch_bounds__ cap): asking for more would block setmaxnreg.inc forever.
constexpr int kLaunchRegisters = 168;
constexpr int kProducerRegisters = 88;
constexpr int kConsumerRegisters = 208;
static_assert(kProducerRegisters * kWarpgroup + kConsumerRegisters * kConsumers * kWarpgroup <=
                  kLaunchRegisters * kThreads, "the register split exceeds the launch allocation");

using Barrier = cutlass::arch::ClusterBarrier;

// Keys per stage (the N of S = Q K^T) and the ring depth. 64-key chunks 4 deep, consumed in a
// software pipeline with two P register buffers; 128-key chunks (2 deep, consumed one at a time,
// as S, O and one P fill the registers) measured 0.67-0.95x of this on 9 of the 10 benchmark
// problems (1.43x on 16x16 windows with stride 16, whose boxes are 4 chunks; H100, 2026-11-24).
template <int CHUNK>
struct Ring {
  static constexpr int kStages = 4;
  // Ring positions: the n-th chunk a CTA handles (over all its pairs) sits in stage
  // n % kStages, and its barriers complete their phase number n / kStages.
  static __device__ int stage(int n) { return n % kStages; }
  static __device__ uint32_t phase(int n) { return (n / kStages) & 1; }
};

template <typename T, int D, int CHUNK>
struct Smem {
  static constexpr int kChunk = CHUNK, kStages = Ring<CHUNK>::kStages;
  static constexpr int kQElems = kHalfRows * D;  // one half's [64][D] queries
  static constexpr int kTileElems = kChunk * D;  // a [kChunk][D] key or value tile
  static constexpr size_t kTileBytes = kTileElems * sizeof(T);
  static constexpr size_t kQ = 0;                                          // [buffer][half][64][D]
  static constexpr size_t kK = kQ + 2 * kConsumers * kQElems * sizeof(T);  // [stage][kChunk][D]
  static constexpr size_t kV = kK + kStages * kTileBytes;
  // Box coordinates of each stage's keys (int4: x0, x1, x2, unused), written by the producer.
  static constexpr size_t kCoords = kV + kStages * kTileBytes;
  static constexpr size_t kBarriers = kCoords + kStages * kChunk * sizeof(int4);
  // Q full[2], Q empty[2], K/V full[stages], K/V empty[stages].
  static constexpr int kBarrierCount = 4 + 2 * kStages;
  static constexpr size_t kBytes = kBarriers + kBarrierCount * sizeof(uint64_t);
  // Tiles must start 1024-byte aligned (the swizzle is applied to address bits); dynamic shared
  // memory is only promised 16, so the launch asks for one alignment's worth more.
  static constexpr size_t kLaunchBytes = kBytes + 1024;
  static_assert(kTileBytes % 1024 == 0, "tiles 1024-aligned");
};

// Element offsets of a box's rows: offset(x) = base + sum x[a] * step[a].
struct BoxRows {
  const unsigned char* base;
  int64_t step[kMaxRank];  // bytes per box position along each axis (stride * dilation)
};

template <typename T>
__device__ inline BoxRows box_rows(const AttentionParams& p, const TokenTensor& t, const TileWork& w, int head,
                                   const int (&lo)[kMaxRank]) {
  int64_t offset = w.batch * t.batch_stride + head * t.head_stride;
  BoxRows r;
  for (int a = 0; a < kMaxRank; ++a) {
    offset += static_cast<int64_t>(lo[a] * p.axis[a].dilation + w.group[a]) * t.axis_stride[a];
    r.step[a] = static_cast<int64_t>(p.axis[a].dilation) * t.axis_stride[a] * sizeof(T);
  }
  r.base = reinterpret_cast<const unsigned char*>(t.ptr) + offset * sizeof(T);
  return r;
}

__device__ inline const void* row_address(const BoxRows& r, const BoxCursor& c) {
  return r.base + c.x[0] * r.step[0] + c.x[1] * r.step[1] + c.x[2] * r.step[2];
}

// Producer side of one chunk: rows [first, first + 64) of the key box into the K and V stages,
// and their box coordinates (the consumers' masks read them: one shared load per key instead of
// unravelling it in every thread). Thread pt copies 16-byte piece pt % PIECES of rows
// pt / PIECES + i * (128 / PIECES).
template <typename T, int D, int kChunk>
__device__ inline void copy_chunk(T* sK, T* sV, int4* coords, const BoxRows& keys, const BoxRows& values,
                                  BoxCursor row, const int (&extent)[kMaxRank], int pt) {
  constexpr int kPieces = D / 8;
  constexpr int kRowsPerPass = kWarpgroup / kPieces;
  const int piece = pt % kPieces;
#pragma unroll 4  // the producer runs on few registers (kProducerRegisters)
  for (int pass = 0; pass < kChunk / kRowsPerPass; ++pass) {
    const int r = pt / kPieces + pass * kRowsPerPass;
    const bool valid = row.x[0] < extent[0];
    const int dst = swizzled_element<kChunk>(r, piece);
    const int src = piece * 16;  // bytes
    copy16_async(sK + dst, valid ? static_cast<const unsigned char*>(row_address(keys, row)) + src : keys.base, valid);
    copy16_async(sV + dst, valid ? static_cast<const unsigned char*>(row_address(values, row)) + src : values.base, valid);
    // Keys past the box get a coordinate no window holds.
    if (piece == 0) coords[r] = valid ? make_int4(row.x[0], row.x[1], row.x[2], 0) : make_int4(kPastBox, kPastBox, kPastBox, 0);
    advance(row, kRowsPerPass, extent);
  }
}

// A pair's queries into its two [64][D] halves (rows a half does not own, or past the grid,
// zero-filled).
template <typename T, int D>
__device__ inline void copy_queries(T* sQ, const AttentionParams& p, const TileWork& w, const TileShape& shape,
                                    int pt) {
  constexpr int kPieces = D / 8;
  constexpr int kRowsPerPass = kWarpgroup / kPieces;
  const T* base = reinterpret_cast<const T*>(p.query.ptr) + w.batch * p.query.batch_stride + w.head * p.query.head_stride;
  const int piece = pt % kPieces;
#pragma unroll
  for (int half = 0; half < kConsumers; ++half) {
    const TileHalf h = tile_half(w, shape, half);
#pragma unroll
    for (int pass = 0; pass < kHalfRows / kRowsPerPass; ++pass) {
      const int r = pt / kPieces + pass * kRowsPerPass;
      int x[kMaxRank];
      const bool valid = r < h.rows && tile_row_coords(w, shape, h.first_row + r, x);
      copy16_async(sQ + half * kHalfRows * D + swizzled_element<kHalfRows>(r, piece),
                   valid ? base + token_offset(p, p.query, w, x) + piece * 8 : base, valid);
    }
  }
}

// Makes this thread's finished cp.async writes visible to the tensor cores (async proxy), then
// counts it in on `bar`.
__device__ inline void publish(uint64_t* bar) {
  cutlass::arch::fence_view_async_shared();
  Barrier::arrive(bar);
}

// 2^x in one MUFU instruction (ex2.approx.ftz: about 2 ulp, denormal results flushed to zero,
// as FlashAttention's exponentials). exp2f adds a range fix-up of about four instructions per
// score, which was a fifth of the consumer's instructions.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// A pair tile and the union key box its two halves walk, in chunks of `chunk` keys (producer
// and consumers derive the same walk from it).
struct PairBox {
  TileWork work;
  int lo[kMaxRank], extent[kMaxRank];
  int chunks;
};

__device__ inline PairBox pair_box(const AttentionParams& p, const TileShape& shape, int64_t pair, int chunk) {
  PairBox b;
  b.work = locate_tile(p, shape, p.heads, static_cast<int>(pair));
  key_box(p, b.work, b.lo, b.extent);
  b.chunks = (b.extent[0] * b.extent[1] * b.extent[2] + chunk - 1) / chunk;
  return b;
}

template <typename T, int D, int CHUNK>
__device__ inline void produce(const AttentionParams& p, const TileShape& shape, int64_t pairs, T* sQ, T* sK, T* sV,
                               int4* sCoord, uint64_t* q_full, uint64_t* q_empty, uint64_t* full, uint64_t* empty) {
  using L = Smem<T, D, CHUNK>;
  using R = Ring<CHUNK>;
  constexpr int kChunk = CHUNK, kStages = R::kStages;
  const int pt = threadIdx.x % kWarpgroup;
  int chunk_count = 0, pair_count = 0;
  for (int64_t pair = blockIdx.x; pair < pairs; pair += gridDim.x) {
    const PairBox box = pair_box(p, shape, pair, kChunk);
    const TileWork& w = box.work;
    if (w.empty) continue;
    const int kv_head = w.head / (p.heads / p.kv_heads);
    const BoxRows keys = box_rows<T>(p, p.key, w, kv_head, box.lo);
    const BoxRows values = box_rows<T>(p, p.value, w, kv_head, box.lo);
    const int buffer = pair_count & 1;
    // The consumers release a query buffer after the pair that used it, two pairs back.
    if (pair_count >= 2) Barrier::wait(&q_empty[buffer], ((pair_count >> 1) - 1) & 1);
    copy_queries<T, D>(sQ + buffer * kConsumers * L::kQElems, p, w, shape, pt);
    copy_async_commit();
    BoxCursor row = box_cursor(pt / (D / 8), box.extent);
    for (int c = 0; c < box.chunks; ++c) {
      const int n = chunk_count + c, stage = R::stage(n);
      if (n >= kStages) Barrier::wait(&empty[stage], R::phase(n) ^ 1);
      copy_chunk<T, D, kChunk>(sK + stage * L::kTileElems, sV + stage * L::kTileElems, sCoord + stage * kChunk, keys,
                               values, row, box.extent, pt);
      copy_async_commit();
      advance(row, kChunk, box.extent);
      // Publish the group before this one (the queries, before chunk 0) while this one flies.
      copy_async_wait_one_pending();
      publish(c == 0 ? &q_full[buffer] : &full[R::stage(n - 1)]);
    }
    copy_async_wait_all();
    publish(&full[R::stage(chunk_count + box.chunks - 1)]);
    chunk_count += box.chunks;
    ++pair_count;
  }
}

template <typename T, int D, int RANK, int CHUNK>
__device__ inline void consume(const AttentionParams& p, const TileShape& shape, int64_t pairs, const T* sQ,
                               const T* sK, const T* sV, const int4* sCoord, uint64_t* q_full, uint64_t* q_empty,
                               uint64_t* full, uint64_t* empty) {
  using L = Smem<T, D, CHUNK>;
  using R = Ring<CHUNK>;
  constexpr int kChunk = CHUNK;
  constexpr int kSRegs = kChunk / 2;  // S accumulators per thread (64 x kChunk over 128 threads)
  constexpr int kORegs = D / 2;
  constexpr int kKeyTiles = kChunk / 8;
  const int half = threadIdx.x / kWarpgroup - 1;
  const int tid = threadIdx.x % kWarpgroup;
  const int warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;
  const float scale_log2 = p.scale * kLog2e;
  int chunk_count = 0, pair_count = 0;

  for (int64_t pair = blockIdx.x; pair < pairs; pair += gridDim.x) {
    const PairBox box = pair_box(p, shape, pair, kChunk);
    if (box.work.empty) continue;
    const TileWork& w = box.work;
    const int(&key_lo)[kMaxRank] = box.lo;
    const int(&key_extent)[kMaxRank] = box.extent;
    const int chunks = box.chunks;
    const TileHalf h = tile_half(w, shape, half);
    const FlatRun run = own_key_run(p, h, key_lo, key_extent);
    const int first_chunk = run.lo / kChunk, end_chunk = (run.hi + kChunk - 1) / kChunk;
    // Keys every row of the half attends (relative to the union box): a chunk inside it needs no mask.
    const BoxWindow common = box_window(common_window(p, h.work), key_lo);

    // The two rows this thread accumulates, and their neighbourhoods relative to the union box.
    const int row_a = warp * 16 + g, row_b = row_a + 8;
    int x_a[kMaxRank], x_b[kMaxRank];
    const bool inside_a = row_a < h.rows && tile_row_coords(w, shape, h.first_row + row_a, x_a);
    const bool inside_b = row_b < h.rows && tile_row_coords(w, shape, h.first_row + row_b, x_b);
    const BoxWindow win_a = box_window(query_window(p, w, x_a, inside_a), key_lo);
    const BoxWindow win_b = box_window(query_window(p, w, x_b, inside_b), key_lo);

    float o[kORegs];
#pragma unroll
    for (int i = 0; i < kORegs; ++i) o[i] = 0.f;
    float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.f, l_b = 0.f;  // maxima in raw score units
    const int buffer = pair_count & 1;
    const T* sQ_half = sQ + (buffer * kConsumers + half) * L::kQElems;
    Barrier::wait(&q_full[buffer], (pair_count >> 1) & 1);

    // S = Q K^T of a chunk, issued (not waited for).
    auto issue_scores = [&](float (&s)[kSRegs], int stage) {
      const T* sK_now = sK + stage * L::kTileElems;
#pragma unroll
      for (int ks = 0; ks < D / 16; ++ks) {
        mma_ss<T, kChunk>(k_major_descriptor<T, kHalfRows>(sQ_half, ks), k_major_descriptor<T, kChunk>(sK_now, ks), s,
                          ks > 0);
      }
      cute::warpgroup_commit_batch();
    };
    // O += P V of a chunk, issued (not waited for).
    auto issue_values = [&](const uint32_t (&pa)[kChunk / 16][4], int stage) {
      const T* sV_now = sV + stage * L::kTileElems;
#pragma unroll
      for (int kk = 0; kk < kChunk / 16; ++kk) mma_rs<T, D>(pa[kk], mn_major_descriptor<T, kChunk>(sV_now, kk), o);
      cute::warpgroup_commit_batch();
    };
    // Mask, online softmax and P's A fragments of chunk c's scores; returns the rescale factors
    // of O (applied by the caller once the previous chunk's P V has finished with O).
    auto softmax = [&](float (&s)[kSRegs], int stage, int c, uint32_t (&pa)[kChunk / 16][4], float& alpha_a,
                       float& alpha_b) {
      const int4* key_coord = sCoord + stage * kChunk;
      // Mask unless every key of the chunk is in every row's window: the chunk lies in the half's
      // run and the box its first and last keys span lies in the common window.
      const bool masked = c * kChunk < run.lo || (c + 1) * kChunk > run.hi ||
                          !spans_inside(key_coord[0], key_coord[kChunk - 1], common, key_extent);
      if (masked) {  // one branch per chunk (a test per score would cost a branch per score)
#pragma unroll
        for (int j = 0; j < kKeyTiles; ++j) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int4 key = key_coord[8 * j + 2 * t + e];
            if (!holds<RANK>(win_a, key)) s[4 * j + e] = -INFINITY;
            if (!holds<RANK>(win_b, key)) s[4 * j + 2 + e] = -INFINITY;
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
      // Two adjacent 8-key accumulator tiles are one 16-key k-step of P.
#pragma unroll
      for (int kk = 0; kk < kChunk / 16; ++kk) {
        pa[kk][0] = pack2<T>(s[8 * kk + 0], s[8 * kk + 1]);
        pa[kk][1] = pack2<T>(s[8 * kk + 2], s[8 * kk + 3]);
        pa[kk][2] = pack2<T>(s[8 * kk + 4], s[8 * kk + 5]);
        pa[kk][3] = pack2<T>(s[8 * kk + 6], s[8 * kk + 7]);
      }
    };
    auto rescale = [&](float alpha_a, float alpha_b) {
      // Once the row maxima settle (after a chunk or two) the rescale is a no-op: skip it.
      if (!__any_sync(0xffffffff, alpha_a != 1.f || alpha_b != 1.f)) return;
#pragma unroll
      for (int j = 0; j < kORegs / 4; ++j) {
        o[4 * j + 0] *= alpha_a;
        o[4 * j + 1] *= alpha_a;
        o[4 * j + 2] *= alpha_b;
        o[4 * j + 3] *= alpha_b;
      }
    };
    // Chunks outside this half's run are only waited for and released (the ring needs both).
    auto pass_over = [&](int c) {
      const int n = chunk_count + c;
      Barrier::wait(&full[R::stage(n)], R::phase(n));
      Barrier::arrive(&empty[R::stage(n)]);
    };

    for (int c = 0; c < first_chunk; ++c) pass_over(c);
    if (first_chunk < end_chunk) {
      // Software pipeline: chunk c's S = Q K^T runs on the tensor cores while chunk c - 1's
      // P V does, and chunk c's softmax overlaps the tail of that P V.
      float s[kSRegs];
      uint32_t pa_prev[kChunk / 16][4], pa[kChunk / 16][4];
      float alpha_a, alpha_b;
      int prev_stage = R::stage(chunk_count + first_chunk);
      Barrier::wait(&full[prev_stage], R::phase(chunk_count + first_chunk));
      cute::warpgroup_arrive();
      issue_scores(s, prev_stage);
      cute::warpgroup_wait<0>();
      fence_registers(s);
      softmax(s, prev_stage, first_chunk, pa_prev, alpha_a, alpha_b);  // O is still zero: no rescale
      // One step: chunk c's scores and softmax (into `next`) around the P V of `current`.
      auto step = [&](int c, uint32_t (&current)[kChunk / 16][4], uint32_t (&next)[kChunk / 16][4]) {
        const int n = chunk_count + c, stage = R::stage(n);
        Barrier::wait(&full[stage], R::phase(n));
        fence_registers(o);
        cute::warpgroup_arrive();
        issue_scores(s, stage);
        issue_values(current, prev_stage);
        cute::warpgroup_wait<1>();  // the scores (committed first) are ready
        fence_registers(s);
        softmax(s, stage, c, next, alpha_a, alpha_b);
        cute::warpgroup_wait<0>();  // the previous P V is done with O, its P and its stage
        fence_registers(o);
        fence_fragments(current);
        Barrier::arrive(&empty[prev_stage]);
        rescale(alpha_a, alpha_b);
        prev_stage = stage;
      };
      // Two steps per iteration, so P's two register buffers swap roles without a copy (a copy
      // would define a wgmma input inside the pipeline and serialise the MMAs).
      int c = first_chunk + 1;
      for (; c + 1 < end_chunk; c += 2) {
        step(c, pa_prev, pa);
        step(c + 1, pa, pa_prev);
      }
      if (c < end_chunk) {
        step(c, pa_prev, pa);
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
    }
    for (int c = end_chunk; c < chunks; ++c) pass_over(c);
    Barrier::arrive(&q_empty[buffer]);
    chunk_count += chunks;
    ++pair_count;

    // Write O / l and the natural-log LSE for the rows inside the grid (maxima in raw units).
    l_a = quad_sum(l_a);
    l_b = quad_sum(l_b);
    if (inside_a) {
      store_row<T, kORegs / 4>(p, w, x_a, l_a, m_a * scale_log2, t,
                               [&](int j) { return make_float2(o[4 * j + 0], o[4 * j + 1]); });
    }
    if (inside_b) {
      store_row<T, kORegs / 4>(p, w, x_b, l_b, m_b * scale_log2, t,
                               [&](int j) { return make_float2(o[4 * j + 2], o[4 * j + 3]); });
    }
  }
}

template <typename T, int D, int RANK, int CHUNK>
__global__ void __launch_bounds__(kThreads, 1) forward_kernel(const AttentionParams p, const TileShape shape,
                                                              int64_t pairs) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using L = Smem<T, D, CHUNK>;
  constexpr int kStages = L::kStages;
  extern __shared__ unsigned char smem_unaligned[];
  const uint32_t raw = cute::cast_smem_ptr_to_uint(smem_unaligned);
  unsigned char* smem = smem_unaligned + ((1024 - (raw & 1023)) & 1023);
  T* sQ = reinterpret_cast<T*>(smem + L::kQ);
  T* sK = reinterpret_cast<T*>(smem + L::kK);
  T* sV = reinterpret_cast<T*>(smem + L::kV);
  int4* sCoord = reinterpret_cast<int4*>(smem + L::kCoords);
  uint64_t* q_full = reinterpret_cast<uint64_t*>(smem + L::kBarriers);
  uint64_t* q_empty = q_full + 2;
  uint64_t* full = q_empty + 2;
  uint64_t* empty = full + kStages;

  if (threadIdx.x == 0) {
    for (int b = 0; b < 2; ++b) {
      Barrier::init(&q_full[b], kWarpgroup);
      Barrier::init(&q_empty[b], kConsumers * kWarpgroup);
    }
    for (int s = 0; s < kStages; ++s) {
      Barrier::init(&full[s], kWarpgroup);
      Barrier::init(&empty[s], kConsumers * kWarpgroup);
    }
  }
  cutlass::arch::fence_barrier_init();
  __syncthreads();

  if (threadIdx.x < kWarpgroup) {
    cutlass::arch::warpgroup_reg_dealloc<kProducerRegisters>();
    produce<T, D, CHUNK>(p, shape, pairs, sQ, sK, sV, sCoord, q_full, q_empty, full, empty);
  } else {
    cutlass::arch::warpgroup_reg_alloc<kConsumerRegisters>();
    consume<T, D, RANK, CHUNK>(p, shape, pairs, sQ, sK, sV, sCoord, q_full, q_empty, full, empty);
  }
#endif
}

// The grid's rank once leading unit axes are dropped (masks test only the others).
inline int effective_rank(const AttentionParams& p) {
  int rank = kMaxRank;
  for (int a = 0; a < kMaxRank - 1 && p.axis[a].length == 1; ++a) --rank;
  return rank;
}

template <typename T, int D, int CHUNK>
std::string launch(const AttentionParams& p) {
  const TileShape shape = choose_pair_tile(p);
  const int64_t pairs = count_tiles(p, shape, p.heads);
  if (pairs > kMaxCtas) return "the problem needs more than 2^31 - 1 pair tiles";
  int sms = 0;
  HALOATTN_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, p.device));
  const int rank = effective_rank(p);
  auto kernel = rank == 1   ? forward_kernel<T, D, 1, CHUNK>
                : rank == 2 ? forward_kernel<T, D, 2, CHUNK>
                            : forward_kernel<T, D, 3, CHUNK>;
  const size_t smem = Smem<T, D, CHUNK>::kLaunchBytes;
  HALOATTN_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  // Persistent: one CTA per SM (its shared memory allows no second), each walking pairs
  // blockIdx.x, + gridDim.x, ...: the pairs in flight at once are neighbours, whose key boxes
  // overlap in L2.
  const unsigned ctas = static_cast<unsigned>(std::min<int64_t>(pairs, sms));
  kernel<<<ctas, kThreads, smem, reinterpret_cast<cudaStream_t>(p.stream)>>>(p, shape, pairs);
  HALOATTN_CUDA_TRY(cudaGetLastError());
  return {};
}

}  // namespace
}  // namespace sm90

std::string forward_sm90(const AttentionParams& p) {
  return dispatch_dtype_dim(p, [&](auto dtype_tag, auto dim_tag) {
    using T = typename decltype(dtype_tag)::type;
    constexpr int D = decltype(dim_tag)::value;
    return sm90::launch<T, D, 64>(p);
  });
}

}  // namespace haloattn
