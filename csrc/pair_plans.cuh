// The Hopper forward's per-pair geometry, worked out by two warps of the producer warpgroup
// (which otherwise only issues copies from one thread) into a ring of plans in shared memory.
// Every consumer thread used to work it out for itself at each pair's start (locate the pair,
// its key tiles, its half's tile ranges, its two rows' windows): some 850 of about 3100
// instructions per pair and warp on a four-tile walk, in the consumers' critical path between
// one pair's last product and the next pair's first. Plans are written pairs ahead; the
// consumers read their part with a few shared loads.
#pragma once

#include <cstdint>

#include "key_tiles.cuh"
#include "pair_tiles.cuh"
#include "row_windows.cuh"
#include "token_tiles.cuh"

namespace haloattn {

// One query row of a half: its keys per axis, and where its LSE goes (-1: past the grid).
struct alignas(16) RowPlan {
  RowWindow window;
  int64_t lse;
};
static_assert(sizeof(RowPlan) == 32, "two 16-byte loads per row");

// One consumer's half of a pair: the half as a tile (the output copy's corner; empty past the
// grid) and the pair's key tiles it visits and leaves unmasked.
struct HalfPlan {
  TileWork work;
  HalfTiles own;
};

constexpr int kPlanHalfRows = 64;  // rows per half (the consumers' kHalfRows)

// The pair's key tile walk (PairTiles without the pair's own tile).
struct KeyTileWalk {
  int start[kMaxRank];
  int tiles[kMaxRank];
  int chunks;
};

__device__ inline KeyTileWalk key_tile_walk(const PairTiles& t) {
  KeyTileWalk k;
  for (int a = 0; a < kMaxRank; ++a) {
    k.start[a] = t.start[a];
    k.tiles[a] = t.tiles[a];
  }
  k.chunks = t.chunks;
  return k;
}

struct PairPlan {
  int done;  // 1: the CTA has no more pairs; nothing else is set
  KeyTileWalk walk;
  HalfPlan half[2];
  RowPlan rows[2][kPlanHalfRows];
};

// Rows [0, 64) of a half with tile w (half_tile its shape), two per lane of a planning warp. A
// half's rows are a contiguous run of its pair's rows in flat order (pair_tiles.cuh), so the
// half's own tile gives each row the coordinates the pair gives it (tests/cuda_host/
// tiling_check.cu compares them) and the planning lanes need only the half, not the pair.
__host__ __device__ inline void write_half_rows(const AttentionParams& p, const TileShape& half_tile,
                                                const TileWork& w, int lane, RowPlan* rows) {
#pragma unroll
  for (int i = 0; i < kPlanHalfRows / 32; ++i) {
    const int row = lane + 32 * i;
    int x[kMaxRank];
    const bool inside = !w.empty && tile_row_coords(w, half_tile, row, x);
    rows[row].window = query_window(p, w, x, inside);
    rows[row].lse = inside ? lse_index(p, w, x) : -1;
  }
}

}  // namespace haloattn
