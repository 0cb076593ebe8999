// Host check of the kernels' work decomposition (csrc/token_tiles.cuh, row_windows.cuh), for
// tests/test_cuda_build.py. For each problem read from stdin ("pattern" then per axis of the
// padded rank-3 grid "length window stride dilation causal shift"), it walks the CTAs exactly as
// the kernels do and checks that:
//   forward / dQ: every query is in exactly one tile, and the tile's key box holds every key the
//                 query attends (the count of box keys passing `attends` equals the brute force),
//                 and attends every key of the tile's common window;
//                 where tile_shares_one_window, every query attends the whole box (no mask);
//   dK/dV:       every key is in exactly one tile, and the tile's query box holds every query
//                 that attends it;
//   pair tiles:   (the Hopper kernels, key_tiles.cuh; both the query-major walk of the forward and
//                 dQ and the key-major one of dK/dV, whose partner tiles hold queries and whose
//                 rows' windows come from the inverse rule) each token is in exactly one half of one
//                 pair and a half's rows lie in its own box; the key tiling is 64 tokens of
//                 power-of-two extents that fit a copy box; every key a row attends lies in a key
//                 tile the half computes; on every such tile the row's bit mask (row_mask, at the
//                 kernel's rank and at rank 3) agrees with `attends` key by key, and tiles the
//                 half leaves unmasked are attended whole by every row; run_length splits the
//                 tiles inside the half's range into the runs a row-major walk meets (and
//                 tiling_totals counts them, with the computed, masked and passed-over tiles); the
//                 forward's planned rows (pair_plans.cuh: worked out from the half's own tile)
//                 equal the pair's rows, windows and LSE indices.
// Prints "ok" or the first mismatch, one line per problem.
#include <cstdio>
#include <vector>

#include "key_tiles.cuh"
#include "pair_plans.cuh"
#include "pair_tiles.cuh"
#include "pair_tiling.h"
#include "problem_input.h"
#include "row_windows.cuh"

using namespace haloattn;

namespace {

bool attends_brute(const AttentionParams& p, const int (&q)[kMaxRank], const int (&k)[kMaxRank]) {
  for (int a = 0; a < kMaxRank; ++a) {
    const AxisParams& x = p.axis[a];
    if (q[a] % x.dilation != k[a] % x.dilation) return false;
    const int g = q[a] % x.dilation, len = group_length(x, g);
    const Range r = key_range(x, p.pattern, q[a] / x.dilation, len);
    if (k[a] / x.dilation < r.lo || k[a] / x.dilation >= r.hi) return false;
  }
  return true;
}

void token_coords(const AttentionParams& p, int flat, int (&c)[kMaxRank]) {
  const int extent[kMaxRank] = {p.axis[0].length, p.axis[1].length, p.axis[2].length};
  unravel3(flat, extent, c);
}

// Walks one direction: `forward` = query tiles over key boxes, else key tiles over query boxes.
const char* check(const AttentionParams& p, bool forward) {
  const TileShape shape = choose_tile(p);
  const int tokens = static_cast<int>(grid_tokens(p));
  std::vector<int> seen(tokens, 0);
  const int64_t ctas = count_tiles(p, shape, 1);
  for (int cta = 0; cta < ctas; ++cta) {
    const TileWork w = locate_tile(p, shape, 1, cta);
    if (w.empty) continue;
    int lo[kMaxRank], extent[kMaxRank];
    if (forward) key_box(p, w, lo, extent); else query_box(p, w, lo, extent);
    const int box = extent[0] * extent[1] * extent[2];
    for (int row = 0; row < kTileTokens; ++row) {
      int x[kMaxRank];
      if (!tile_row_coords(w, shape, row, x)) continue;
      int own[kMaxRank];
      for (int a = 0; a < kMaxRank; ++a) own[a] = x[a] * p.axis[a].dilation + w.group[a];
      const int own_flat = static_cast<int>(token_index(p, w, x));
      seen[own_flat] += 1;
      int found = 0;
      const RowWindow own_window = query_window(p, w, x, true);
      for (int first = 0; first < box; first += kTileTokens) {
        for (int col = 0; col < kTileTokens; ++col) {
          int y[kMaxRank];
          if (!box_coords(first + col, lo, extent, y)) continue;
          if (forward) {
            found += attends(own_window, y);
          } else {
            found += attends(query_window(p, w, y, true), x);
          }
        }
      }
      int expected = 0;
      for (int other = 0; other < tokens; ++other) {
        int c[kMaxRank];
        token_coords(p, other, c);
        expected += forward ? attends_brute(p, own, c) : attends_brute(p, c, own);
      }
      if (found != expected) return forward ? "a query's key box misses keys" : "a key's query box misses queries";
      if (forward && tile_shares_one_window(p, w) && found != box) return "a shared-window tile's box is not its window";
      if (forward) {
        // Every key of the common window is attended by this query (the Hopper kernel skips
        // the mask of chunks inside it).
        const RowWindow common = common_window(p, w);
        for (int flat = 0; flat < box; ++flat) {
          int y[kMaxRank];
          box_coords(flat, lo, extent, y);
          if (attends(common, y) && !attends(own_window, y)) return "a common-window key is not attended";
        }
      }
    }
  }
  for (int i = 0; i < tokens; ++i)
    if (seen[i] != 1) return "a token is not in exactly one tile";
  return "ok";
}

// The keys token `own` attends or, with `inverse`, the queries that attend it.
int attended_count(const AttentionParams& p, const int (&own)[kMaxRank], bool inverse) {
  int expected = 0;
  for (int other = 0; other < static_cast<int>(grid_tokens(p)); ++other) {
    int c[kMaxRank];
    token_coords(p, other, c);
    expected += inverse ? attends_brute(p, c, own) : attends_brute(p, own, c);
  }
  return expected;
}

// The grid's rank once leading unit axes are dropped, as the Hopper kernel instantiates it.
int effective_rank(const AttentionParams& p) {
  int rank = kMaxRank;
  for (int a = 0; a < kMaxRank - 1 && p.axis[a].length == 1; ++a) --rank;
  return rank;
}

uint64_t row_mask_at_rank(int rank, const RowWindow& w, const int (&origin)[kMaxRank], const KeyTiling& kt,
                          const uint64_t* below) {
  return rank == 1 ? row_mask<1>(w, origin, kt, below) : rank == 2 ? row_mask<2>(w, origin, kt, below)
                                                                   : row_mask<3>(w, origin, kt, below);
}

// The Hopper kernels' pair tiles: the forward and dQ walk (rows are queries, partner tiles hold
// keys) or, with `inverse`, the dK/dV walk (rows are keys, partner tiles hold the queries that
// attend them).
const char* check_pairs(const AttentionParams& p, bool inverse) {
  TileShape shape;
  KeyTiling kt;
  const bool tiled = choose_pair_tiling(p, inverse, shape, kt);
  {
    // The per-thread cache answers again after the other direction's search with what a fresh
    // search gives.
    TileShape other_shape, again_shape, fresh_shape;
    KeyTiling other_kt, again_kt, fresh_kt;
    choose_pair_tiling(p, !inverse, other_shape, other_kt);
    const bool again = choose_pair_tiling(p, inverse, again_shape, again_kt);
    const bool fresh = search_pair_tiling(p, inverse, fresh_shape, fresh_kt);
    if (again != tiled || fresh != tiled) return "choose_pair_tiling's answer changes between calls";
    for (int a = 0; tiled && a < kMaxRank; ++a)
      if (again_shape.n[a] != shape.n[a] || fresh_shape.n[a] != shape.n[a] || again_kt.n[a] != kt.n[a] ||
          fresh_kt.n[a] != kt.n[a])
        return "choose_pair_tiling's answer changes between calls";
  }
  if (tiled && shape.n[0] * shape.n[1] * shape.n[2] > 2 * kTileTokens) return "a pair tile holds more than 128 tokens";
  if (!tiled) {
    // Only a dilation too wide for a copy box may leave no tiling.
    for (int a = 0; a < kMaxRank; ++a)
      if (p.axis[a].dilation > 4) return "ok";
    return "no key tiling for a problem a copy box can read";
  }
  int product = 1;
  for (int a = 0; a < kMaxRank; ++a) {
    if ((kt.n[a] & (kt.n[a] - 1)) != 0) return "a key tile extent is not a power of two";
    if (kt.n[a] * p.axis[a].dilation > 256) return "a key tile exceeds a copy box";
    product *= kt.n[a];
  }
  if (product != kKeyTileTokens) return "a key tile does not hold 64 tokens";
  uint64_t below[kMaxRank * kMaskEntries];
  for (int i = 0; i < kMaxRank * kMaskEntries; ++i) below[i] = prefix_mask(kt, i / kMaskEntries, i % kMaskEntries);
  const int rank = effective_rank(p);
  std::vector<int> seen(grid_tokens(p), 0);
  double computed = 0, masked = 0, runs = 0, passed = 0;  // over every pair, for pair_tiling.h's closed form
  for (int cta = 0; cta < count_tiles(p, shape, 1); ++cta) {
    AttentionParams one_head = p;
    one_head.heads = one_head.kv_heads = 1;
    const PairTiles t = pair_tiles(one_head, shape, kt, cta, inverse);
    const TileWork& w = t.work;
    if (w.empty) continue;
    // The tile grid covers the pair's key box in as few tiles per axis as any grid could: it is
    // anchored at the common window only where that is free.
    int box_lo[kMaxRank], box_extent[kMaxRank];
    partner_box(one_head, w, box_lo, box_extent, inverse);
    for (int a = 0; a < kMaxRank; ++a) {
      if (t.start[a] > box_lo[a] || t.start[a] + t.tiles[a] * kt.n[a] < box_lo[a] + box_extent[a])
        return "the key tile grid does not cover the pair's key box";
      if (t.tiles[a] != (box_extent[a] + kt.n[a] - 1) / kt.n[a])
        return "the key tile grid lays more tiles along an axis than the pair's key box needs";
    }
    for (int half = 0; half < 2; ++half) {
      const TileHalf h = tile_half(w, shape, half);
      if (h.rows > kTileTokens) return "a half holds more than 64 rows";
      const HalfTiles v = half_tiles(p, t, h, kt, inverse);
      double own = 1, full = 1;
      for (int a = 0; a < kMaxRank; ++a) {
        own *= visited_tiles(v, a);
        full *= unmasked_tiles(v, a);
      }
      computed += own;
      passed += t.chunks - own;
      masked += own - full;
      for (int a = 0; a < kMaxRank; ++a)
        if (v.first[a] < 0 || v.end[a] > t.tiles[a] || (!h.work.empty && v.first[a] >= v.end[a]))
          return "a half's key tiles leave the pair's tile grid";
      // The kernel's walk: runs of consecutive tiles inside the half's range, each exactly as
      // long as run_length says.
      TileCursor walk{{0, 0, 0}};
      for (int chunk = 0, run_left = 0; chunk < t.chunks; ++chunk, step_tile(walk, t.tiles)) {
        const bool inside = tile_in(walk, v.first, v.end);
        if (run_left == 0 && inside) run_left = run_length(walk, v, t.tiles), runs += 1;
        if (inside != (run_left > 0)) return "run_length disagrees with the tiles inside the half's range";
        if (run_left > 0) --run_left;
      }
      if (!inverse) {
        RowPlan planned[kPlanHalfRows];
        for (int lane = 0; lane < 32; ++lane) write_half_rows(p, half_shape(shape), h.work, lane, planned);
        for (int r = 0; r < kPlanHalfRows; ++r) {
          int x[kMaxRank];
          const bool inside = r < h.rows && tile_row_coords(w, shape, h.first_row + r, x);
          const RowWindow window = query_window(p, w, x, inside);
          bool same = planned[r].lse == (inside ? lse_index(p, w, x) : -1);
          for (int a = 0; a < kMaxRank; ++a)
            same = same && planned[r].window.lo[a] == window.lo[a] && planned[r].window.hi[a] == window.hi[a];
          if (!same) return "a planned row differs from the pair's row";
        }
      }
      for (int r = 0; r < h.rows; ++r) {
        int x[kMaxRank];
        if (!tile_row_coords(w, shape, h.first_row + r, x)) continue;
        int own[kMaxRank];
        for (int a = 0; a < kMaxRank; ++a) {
          if (x[a] < h.work.x0[a] || x[a] >= h.work.x1[a]) return "a half's row lies outside its box";
          own[a] = x[a] * p.axis[a].dilation + w.group[a];
        }
        seen[token_index(p, w, x)] += 1;
        const RowWindow window = query_window(p, w, x, true, inverse);
        int found = 0;
        TileCursor c{{v.first[0], v.first[1], v.first[2]}};
        for (c.i[0] = v.first[0]; c.i[0] < v.end[0]; ++c.i[0])
          for (c.i[1] = v.first[1]; c.i[1] < v.end[1]; ++c.i[1])
            for (c.i[2] = v.first[2]; c.i[2] < v.end[2]; ++c.i[2]) {
              int origin[kMaxRank];
              for (int a = 0; a < kMaxRank; ++a) origin[a] = t.start[a] + c.i[a] * kt.n[a];
              const uint64_t mask = row_mask_at_rank(rank, window, origin, kt, below);
              if (mask != row_mask<3>(window, origin, kt, below)) return "a row mask depends on the rank it is built at";
              const bool unmasked = tile_in(c, v.full_lo, v.full_hi);
              for (int j = 0; j < kKeyTileTokens; ++j) {
                const int y[kMaxRank] = {origin[0] + j / (kt.n[1] * kt.n[2]), origin[1] + j / kt.n[2] % kt.n[1],
                                         origin[2] + j % kt.n[2]};
                const bool in = attends(window, y);
                found += in;
                if (((mask >> j) & 1) != static_cast<uint64_t>(in)) return "a tile's row mask disagrees with attends";
                if (unmasked && !in) return "an unmasked tile holds a key a row does not attend";
              }
            }
        if (found != attended_count(p, own, inverse))
          return inverse ? "a half's query tiles miss queries that attend its rows" : "a half's key tiles miss keys its rows attend";
      }
    }
  }
  for (int count : seen)
    if (count != 1) return "a token is not in exactly one half of a pair";
  const TilingTotals totals = tiling_totals(p, shape, kt, inverse);
  if (totals.computed != computed || totals.masked != masked)
    return "tiling_totals disagrees with the tiles the pairs visit";
  if (totals.runs != runs) return "tiling_totals disagrees with the runs the pairs' walks meet";
  if (totals.passed != passed) return "tiling_totals disagrees with the tiles the pairs' walks pass over";
  return "ok";
}

}  // namespace

// key_tiles.cuh's prefix masks against their definition, token by token, for every 64-token
// tiling (not only those the problems below pick): bit j of prefix_mask(kt, a, k) is set exactly
// when token j's offset along axis a (row-major over the tile's extents) is below k.
const char* check_prefix_masks() {
  for (int e0 = 0; e0 <= 6; ++e0) {
    for (int e1 = 0; e0 + e1 <= 6; ++e1) {
      const KeyTiling kt{{1 << e0, 1 << e1, 1 << (6 - e0 - e1)}};
      for (int a = 0; a < kMaxRank; ++a) {
        for (int k = 0; k < kMaskEntries; ++k) {
          const uint64_t m = prefix_mask(kt, a, k);
          for (int j = 0; j < kKeyTileTokens; ++j) {
            const int offset = a == 0 ? j / (kt.n[1] * kt.n[2]) : a == 1 ? j / kt.n[2] % kt.n[1] : j % kt.n[2];
            if (((m >> j) & 1) != (offset < k ? 1u : 0u)) return "a prefix mask disagrees with its definition";
          }
        }
      }
    }
  }
  return "ok";
}

int main() {
  const char* masks = check_prefix_masks();
  AttentionParams p;
  while (read_problem(p)) {
    const char* verdict = "ok";
    for (const char* v : {masks, check(p, true), check(p, false), check_pairs(p, false), check_pairs(p, true)})
      if (verdict[0] == 'o' && verdict[1] == 'k') verdict = v;
    std::printf("%s\n", verdict);
  }
  return 0;
}
