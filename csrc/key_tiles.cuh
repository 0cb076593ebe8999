// How the Hopper forward kernel walks a pair tile's keys: in spatial key tiles of 64 tokens
// (e.g. 8x8 in 2-D, 2x4x8 in 3-D), each one copied by a single TMA instruction, laid over the
// pair's union key box. Where that costs no extra tile, the tile grid is anchored at the first
// half's common window (the keys every one of its queries attends), so the tiles inside that
// window need no mask at all; the others are masked per row with a 64-bit mask built from
// per-axis prefix masks (two shared loads and an and-not per axis), one bit test per score.
#pragma once

#include <cstdint>

#include "pair_tiles.cuh"
#include "row_windows.cuh"

namespace haloattn {

constexpr int kKeyTileTokens = 64;

// Key tile extents per axis: powers of two whose product is kKeyTileTokens (leading unit axes 1).
struct KeyTiling {
  int n[kMaxRank];
};

// The key tiles over one pair tile's union key box, in group coordinates.
struct PairTiles {
  TileWork work;          // the pair
  int start[kMaxRank];    // low corner of the first key tile along each axis (may precede the box)
  int tiles[kMaxRank];    // key tiles along each axis
  int chunks;             // tiles[0] * tiles[1] * tiles[2]: the pair's ring entries
};

// With `inverse` (the key-major dK/dV pass) the pair is two key tiles of a KV head and its
// partner tiles are query tiles over the box of queries that see them.
__host__ __device__ inline PairTiles pair_tiles(const AttentionParams& p, const TileShape& shape, const KeyTiling& kt,
                                                int64_t pair, bool inverse = false) {
  PairTiles t;
  t.work = locate_tile(p, shape, inverse ? p.kv_heads : p.heads, static_cast<int>(pair));
  t.chunks = 0;
  if (t.work.empty) return t;
  int lo[kMaxRank], extent[kMaxRank];
  partner_box(p, t.work, lo, extent, inverse);
  const RowWindow common = common_window(p, tile_half(t.work, shape, 0).work, inverse);
  t.chunks = 1;
  for (int a = 0; a < kMaxRank; ++a) {
    const int n = kt.n[a];
    // key_range is monotone, so the common window starts inside the box (lo <= anchor). The
    // anchored grid is taken only where it covers the box in as many tiles as one starting at
    // the box: an extra tile costs more than the masks it saves (3-D 7x15x15: 2.02 computed
    // pairs per attended one anchored on every axis, against 1.84 anchored where free).
    const int anchor = common.hi[a] > common.lo[a] ? common.lo[a] : lo[a];
    const int anchored_start = anchor - ceil_div_nonneg(anchor - lo[a], n) * n;
    const int anchored_tiles = ceil_div_nonneg(lo[a] + extent[a] - anchored_start, n);
    const int box_tiles = ceil_div_nonneg(extent[a], n);
    const bool anchor_adds_a_tile = anchored_tiles > box_tiles;
    t.start[a] = anchor_adds_a_tile ? lo[a] : anchored_start;
    t.tiles[a] = anchor_adds_a_tile ? box_tiles : anchored_tiles;
    t.chunks *= t.tiles[a];
  }
  return t;
}

// One consumer's view of a pair's key tiles: per axis, the tiles [first, end) that meet its own
// key box (the rest it only releases) and the tiles [full_lo, full_hi) inside its common window.
struct HalfTiles {
  int first[kMaxRank], end[kMaxRank];
  int full_lo[kMaxRank], full_hi[kMaxRank];
};

// Along axis a: the tiles a half visits, and of those the ones that need no mask.
__host__ __device__ inline int visited_tiles(const HalfTiles& v, int a) { return v.end[a] - v.first[a]; }
__host__ __device__ inline int unmasked_tiles(const HalfTiles& v, int a) {
  return max(min(v.full_hi[a], v.end[a]) - max(v.full_lo[a], v.first[a]), 0);
}

__host__ __device__ inline HalfTiles half_tiles(const AttentionParams& p, const PairTiles& t, const TileHalf& h,
                                                const KeyTiling& kt, bool inverse = false) {
  HalfTiles v;
  int lo[kMaxRank], extent[kMaxRank];
  partner_box(p, h.work, lo, extent, inverse);
  const RowWindow common = common_window(p, h.work, inverse);
  for (int a = 0; a < kMaxRank; ++a) {
    const int n = kt.n[a];
    if (h.work.empty) {
      v.first[a] = v.end[a] = v.full_lo[a] = v.full_hi[a] = 0;
      continue;
    }
    // Every offset below is >= 0: the tiles start at or before the union box, which holds both.
    v.first[a] = div_nonneg(lo[a] - t.start[a], n);
    v.end[a] = div_nonneg(lo[a] + extent[a] - 1 - t.start[a], n) + 1;
    if (common.hi[a] > common.lo[a]) {
      v.full_lo[a] = ceil_div_nonneg(common.lo[a] - t.start[a], n);
      v.full_hi[a] = div_nonneg(common.hi[a] - t.start[a], n);
    } else {
      v.full_lo[a] = v.full_hi[a] = 0;
    }
  }
  return v;
}

// A key tile's index along each axis, walked in row-major order without divisions.
struct TileCursor {
  int i[kMaxRank];
};

__host__ __device__ inline void step_tile(TileCursor& c, const int (&tiles)[kMaxRank]) {
  if (++c.i[2] < tiles[2]) return;
  c.i[2] = 0;
  if (++c.i[1] < tiles[1]) return;
  c.i[1] = 0;
  ++c.i[0];
}

// Whether the tile at cursor c lies in [lo, hi) along every axis.
__host__ __device__ inline bool tile_in(const TileCursor& c, const int (&lo)[kMaxRank], const int (&hi)[kMaxRank]) {
  bool in = true;
#pragma unroll
  for (int a = 0; a < kMaxRank; ++a) in = in && c.i[a] >= lo[a] && c.i[a] < hi[a];
  return in;
}

// How many tiles, in row-major order from c (inside [first, end)), stay inside [first, end): the
// rest of c's row along the last axis, continued over whole rows and slabs while the half's
// range spans the grid along the faster axes.
__host__ __device__ inline int run_length(const TileCursor& c, const HalfTiles& v, const int (&tiles)[kMaxRank]) {
  int length = v.end[2] - c.i[2];
  if (v.first[2] != 0 || v.end[2] != tiles[2]) return length;
  length += (v.end[1] - c.i[1] - 1) * tiles[2];
  if (v.first[1] != 0 || v.end[1] != tiles[1]) return length;
  return length + (v.end[0] - c.i[0] - 1) * tiles[1] * tiles[2];
}

// Prefix masks of a key tile: bit j of below[a][k] is set when the tile's token j (row-major over
// the tile's extents) has axis-a offset < k. kMaskEntries entries per axis cover k = 0..64.
constexpr int kMaskEntries = kKeyTileTokens + 1;

__host__ __device__ inline uint64_t prefix_mask(const KeyTiling& kt, int axis, int k) {
  // Token j's axis-a offset is (j / inner) % n[a], inner the product of the faster axes'
  // extents: within each period of n[a] * inner tokens, the first min(k, n[a]) * inner are set.
  // Built by repeating that block, without the per-token divisions by run-time extents that
  // held every warp at the kernels' start (3.7 % of the forward's samples on 2-D 31x31).
  // (Extents selected, not indexed: a run-time index puts the tiling in local memory.)
  const int n = axis == 0 ? kt.n[0] : axis == 1 ? kt.n[1] : kt.n[2];
  const int inner = axis == 0 ? kt.n[1] * kt.n[2] : axis == 1 ? kt.n[2] : 1;
  const int period = n * inner;
  const int bits = min(max(k, 0), n) * inner;
  const uint64_t block = bits >= kKeyTileTokens ? ~uint64_t{0} : (uint64_t{1} << bits) - 1;
  uint64_t m = 0;
  for (int start = 0; start < kKeyTileTokens; start += period) m |= block << start;
  return m;
}

// The keys of the tile with low corner `origin` that a row with window w attends, as a bit mask
// over the tile's tokens: per axis the window clipped to the tile selects a run of offsets, the
// difference of two prefix masks. Only the RANK trailing axes are tested (the others hold every
// key). An empty window (rows past the grid) gives 0.
template <int RANK>
__host__ __device__ __forceinline__ uint64_t row_mask(const RowWindow& w, const int (&origin)[kMaxRank],
                                                      const KeyTiling& kt, const uint64_t* below) {
  uint64_t m = ~uint64_t{0};
#pragma unroll
  for (int a = kMaxRank - RANK; a < kMaxRank; ++a) {
    const int lo = min(max(w.lo[a] - origin[a], 0), kt.n[a]);
    const int hi = min(max(w.hi[a] - origin[a], 0), kt.n[a]);
    m &= below[a * kMaskEntries + hi] & ~below[a * kMaskEntries + lo];
  }
  return m;
}

}  // namespace haloattn
