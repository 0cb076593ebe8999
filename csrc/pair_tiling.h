// The Hopper kernels' tiling of a problem (host side): the pair tile's shape and the partner
// tiles' shape, chosen together by what they cost over the whole grid.
//
// Candidates: choose_pair_tile's balanced shape and every other power-of-two pair shape of its
// size (128 rows, fewer on tiny grids) that the grid can use (no extent beyond its axis rounded
// up to a power of two, unit axes kept at 1, each half's copy box within 256 token steps), each
// with every power-of-two partner tile of 64 tokens whose extents times their dilation stay
// <= 256 (a TMA box dimension). The cost is 3 per partner tile computed plus 1 per tile that
// needs a mask (the mask and its branch cost about a third of a tile), plus, in the forward, 2 per
// run of consecutive tiles a consumer walks (a software pipeline's fill and drain), plus 0.5 per
// tile a consumer passes over (waits for and releases: the other half's), summed over every pair
// of one (batch, head): exactly, since a pair's tile counts are products of per-axis counts, so
// their sum over the grid is the product of per-axis sums (tiling_totals). One pair in the
// middle of the grid, the earlier yardstick, misjudged shapes that overhang the grid's edges.
// Against the balanced shape this computes 7-18 % fewer tiles on 3-D 16x48x48 with a 7x15x15
// window (either pass, causal in time or not) and the same on the benchmark's 2-D problems.
//
// The search takes up to a few milliseconds on large 3-D grids, so each thread keeps its last
// eight answers, keyed by what they depend on (the axes, the pattern and the direction).
#pragma once

#include <cstring>

#include "key_tiles.cuh"

namespace haloattn {

struct TilingTotals {
  double computed = 0;  // partner tiles the consumers compute, over every pair of one (batch, head)
  double masked = 0;    // of those, tiles that need a per-score mask
  double runs = 0;      // runs of consecutive tiles the consumers walk them in (run_length)
  double passed = 0;    // tiles a consumer only waits for and releases (the other half's)
};

// Pair index of the pair at tile `tile` of dilation group `group` along axis `axis` and at the
// first tile of group 0 along the others (batch 0, head 0): locate_tile's order.
inline int64_t pair_on_axis(const AttentionParams& p, const TileShape& shape, int axis, int group, int tile) {
  int64_t index = 0;
  for (int a = 0; a < kMaxRank; ++a) index = index * p.axis[a].dilation + (a == axis ? group : 0);
  for (int a = 0; a < kMaxRank; ++a) index = index * tiles_along(p.axis[a], shape, a) + (a == axis ? tile : 0);
  return index;
}

inline TilingTotals tiling_totals(const AttentionParams& p, const TileShape& shape, const KeyTiling& kt, bool inverse) {
  // Per half and axis: the sums over every (group, tile) position along that axis of the half's
  // partner tiles along it (own) and of those inside its common window (full); the positions
  // where the half has tiles (spans) and, of those, where its tiles do not span the pair's grid
  // along the axis (partial).
  double own[2][kMaxRank] = {}, full[2][kMaxRank] = {}, spans[2][kMaxRank] = {}, partial[2][kMaxRank] = {};
  double grid[kMaxRank] = {};  // the pairs' tiles along the axis (both halves walk all of them)
  for (int a = 0; a < kMaxRank; ++a) {
    for (int group = 0; group < p.axis[a].dilation; ++group) {
      for (int tile = 0; tile < tiles_along(p.axis[a], shape, a); ++tile) {
        const PairTiles t = pair_tiles(p, shape, kt, pair_on_axis(p, shape, a, group, tile), inverse);
        if (t.work.empty) continue;  // past this group's end along a
        grid[a] += t.tiles[a];
        for (int half = 0; half < 2; ++half) {
          const HalfTiles v = half_tiles(p, t, tile_half(t.work, shape, half), kt, inverse);
          own[half][a] += visited_tiles(v, a);
          full[half][a] += unmasked_tiles(v, a);
          if (visited_tiles(v, a) > 0) {
            spans[half][a] += 1;
            partial[half][a] += v.first[a] != 0 || v.end[a] != t.tiles[a];
          }
        }
      }
    }
  }
  TilingTotals totals;
  totals.passed = 2 * grid[0] * grid[1] * grid[2];
  for (int half = 0; half < 2; ++half) {
    double computed = 1, inside = 1;
    for (int a = 0; a < kMaxRank; ++a) computed *= own[half][a], inside *= full[half][a];
    totals.computed += computed;
    totals.passed -= computed;
    totals.masked += computed - inside;
    // run_length: a half's tiles are one run per row along axis 1 of each slab along axis 0
    // where they do not span the grid along axis 2; else one per slab where they do not span
    // it along axis 1; else one. Each condition depends on one axis' position, so the sum
    // over the grid factors like the tile counts.
    const double* o = own[half];
    const double* s = spans[half];
    const double* q = partial[half];
    totals.runs += q[2] * o[0] * o[1] + (s[2] - q[2]) * (q[1] * o[0] + (s[1] - q[1]) * s[0]);
  }
  return totals;
}

inline int next_power_of_two(int n) {
  int p = 1;
  while (p < n) p *= 2;
  return p;
}

// Whether axis a may have a tile extent above 1: it has more than one token per dilation group,
// or no axis has (then any extents cover the grid).
inline bool extent_allowed(const AttentionParams& p, int a) {
  bool one_token = true;
  for (int b = 0; b < kMaxRank; ++b) one_token = one_token && max_group_length(p.axis[b]) == 1;
  return one_token || max_group_length(p.axis[a]) > 1;
}

// A partner tile candidate: unit axes keep extent 1, and each extent times its dilation fits a
// copy box.
inline bool usable_partner_tile(const AttentionParams& p, const KeyTiling& kt) {
  bool usable = true;
  for (int a = 0; a < kMaxRank; ++a)
    usable = usable && (kt.n[a] == 1 || extent_allowed(p, a)) && kt.n[a] * p.axis[a].dilation <= 256;
  return usable;
}

// A pair shape candidate besides the balanced one: unit axes keep extent 1, no extent beyond what
// the grid can fill, and each half's copy box fits.
inline bool usable_pair_shape(const AttentionParams& p, const TileShape& shape) {
  const TileShape half = half_shape(shape);
  bool usable = true;
  for (int a = 0; a < kMaxRank; ++a) {
    const int length = max_group_length(p.axis[a]);
    usable = usable && (shape.n[a] == 1 || extent_allowed(p, a)) &&
             shape.n[a] <= next_power_of_two(length) && half.n[a] * p.axis[a].dilation <= 256;
  }
  return usable;
}

inline bool search_pair_tiling(const AttentionParams& p, bool inverse, TileShape& best_shape, KeyTiling& best_kt) {
  const TileShape balanced = choose_pair_tile(p);
  const int size = balanced.n[0] * balanced.n[1] * balanced.n[2];
  double best_cost = -1;
  auto consider = [&](const TileShape& shape) {
    for (int e0 = 0; e0 <= 6; ++e0) {
      for (int e1 = 0; e0 + e1 <= 6; ++e1) {
        const KeyTiling kt{{1 << e0, 1 << e1, 1 << (6 - e0 - e1)}};
        if (!usable_partner_tile(p, kt)) continue;
        const TilingTotals totals = tiling_totals(p, shape, kt, inverse);
        // The forward runs each run of tiles as one software pipeline, whose fill and drain
        // (the first tile's scores and softmax, the last P V, not overlapped) cost about two
        // thirds of a tile; the backward takes tile after tile without a pipeline across them.
        // A tile passed over (waited for and released) costs about a sixth of one.
        const double cost =
            3 * totals.computed + totals.masked + (inverse ? 0 : 2 * totals.runs) + 0.5 * totals.passed;
        if (best_cost < 0 || cost < best_cost) best_cost = cost, best_shape = shape, best_kt = kt;
      }
    }
  };
  consider(balanced);  // first: it stays on ties
  // (The balanced shape's own copy box is checked where its tensor maps are encoded.)
  for (int n0 = 1; n0 <= size; n0 *= 2) {
    for (int n1 = 1; n0 * n1 <= size; n1 *= 2) {
      const TileShape shape{{n0, n1, size / (n0 * n1)}};
      if ((n0 != balanced.n[0] || n1 != balanced.n[1]) && usable_pair_shape(p, shape)) consider(shape);
    }
  }
  return best_cost >= 0;
}

// The pair and partner tile shapes for a problem (`inverse`: the key-major backward pass, whose
// pairs are keys and partners queries). False when no partner tile fits a copy box (a 1-D
// dilation above 4).
inline bool choose_pair_tiling(const AttentionParams& p, bool inverse, TileShape& shape, KeyTiling& kt) {
  struct Entry {
    int key[kMaxRank * 6 + 2];
    bool found;
    TileShape shape;
    KeyTiling kt;
  };
  constexpr int kEntries = 8;
  thread_local Entry entries[kEntries];
  thread_local int used = 0, next = 0;
  int key[kMaxRank * 6 + 2];
  for (int a = 0; a < kMaxRank; ++a) {
    const AxisParams& x = p.axis[a];
    const int fields[6] = {x.length, x.window, x.stride, x.dilation, x.causal, x.shift};
    std::memcpy(key + 6 * a, fields, sizeof(fields));
  }
  key[kMaxRank * 6] = static_cast<int>(p.pattern);
  key[kMaxRank * 6 + 1] = inverse ? 1 : 0;
  for (int i = 0; i < used; ++i) {
    if (std::memcmp(entries[i].key, key, sizeof(key)) == 0) {
      shape = entries[i].shape;
      kt = entries[i].kt;
      return entries[i].found;
    }
  }
  Entry& e = entries[next];
  next = (next + 1) % kEntries;
  used = std::min(used + 1, kEntries);
  std::memcpy(e.key, key, sizeof(key));
  e.found = search_pair_tiling(p, inverse, e.shape, e.kt);
  shape = e.shape;
  kt = e.kt;
  return e.found;
}

}  // namespace haloattn
