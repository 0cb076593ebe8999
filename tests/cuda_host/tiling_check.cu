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
//   pair tiles:   (the Hopper forward) each token is in exactly one half of one pair, a half's
//                 rows lie in its own box, its key box is one contiguous run of the union box's
//                 flat positions, and that run holds every key its queries attend; the kernel's
//                 box-relative test (holds) agrees with `attends` on every key of the run, and
//                 every 64-key chunk it leaves unmasked (spans_inside the common window) is
//                 attended whole by every row of the half;
//   box walks:    a BoxCursor (box_cursor.cuh) advanced in the steps the Hopper kernel takes
//                 lands where unravelling the flat position does, and is past the box exactly
//                 when the position is.
// Prints "ok" or the first mismatch, one line per problem.
#include <cstdio>
#include <vector>

#include "box_cursor.cuh"
#include "box_windows.cuh"
#include "pair_tiles.cuh"
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

bool cursor_walks_match(const int (&extent)[kMaxRank]) {
  const int box = extent[0] * extent[1] * extent[2];
  for (int step : {1, 8, 16, 64, 128}) {
    for (int start = 0; start < 2 * step && start <= box; ++start) {
      BoxCursor c = box_cursor(start, extent);
      for (int flat = start; flat < box + 2 * step; flat += step, advance(c, step, extent)) {
        if ((c.x[0] >= extent[0]) != (flat >= box)) return false;
        if (flat >= box) break;
        int x[kMaxRank];
        unravel3(flat, extent, x);
        if (x[0] != c.x[0] || x[1] != c.x[1] || x[2] != c.x[2]) return false;
      }
    }
  }
  return true;
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
    if (forward && cta < 4 && !cursor_walks_match(extent)) return "a box cursor walk disagrees with unravelling";
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

int attended_count(const AttentionParams& p, const int (&own)[kMaxRank]) {
  int expected = 0;
  for (int other = 0; other < static_cast<int>(grid_tokens(p)); ++other) {
    int c[kMaxRank];
    token_coords(p, other, c);
    expected += attends_brute(p, own, c);
  }
  return expected;
}

const char* check_pairs(const AttentionParams& p) {
  const TileShape shape = choose_pair_tile(p);
  if (shape.n[0] * shape.n[1] * shape.n[2] > 2 * kTileTokens) return "a pair tile holds more than 128 tokens";
  std::vector<int> seen(grid_tokens(p), 0);
  for (int cta = 0; cta < count_tiles(p, shape, 1); ++cta) {
    const TileWork w = locate_tile(p, shape, 1, cta);
    if (w.empty) continue;
    int union_lo[kMaxRank], union_extent[kMaxRank];
    key_box(p, w, union_lo, union_extent);
    for (int half = 0; half < 2; ++half) {
      const TileHalf h = tile_half(w, shape, half);
      if (h.rows > kTileTokens) return "a half holds more than 64 rows";
      const FlatRun run = own_key_run(p, h, union_lo, union_extent);
      if (!h.work.empty) {
        int lo[kMaxRank], extent[kMaxRank];
        key_box(p, h.work, lo, extent);
        if (run.hi - run.lo != extent[0] * extent[1] * extent[2]) return "a half's key box is not one run of the union box";
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
        const RowWindow window = query_window(p, w, x, true);
        const BoxWindow relative = box_window(window, union_lo);
        int found = 0;
        for (int flat = run.lo; flat < run.hi; ++flat) {
          int y[kMaxRank];
          if (!box_coords(flat, union_lo, union_extent, y)) continue;
          const bool in = attends(window, y);
          found += in;
          const int4 key = make_int4(y[0] - union_lo[0], y[1] - union_lo[1], y[2] - union_lo[2], 0);
          if (holds<3>(relative, key) != in) return "the box-relative window test disagrees with attends";
        }
        if (found != attended_count(p, own)) return "a half's key run misses keys";
        // Chunks the kernel leaves unmasked hold only keys this row attends.
        const BoxWindow common = box_window(common_window(p, h.work), union_lo);
        const int box = union_extent[0] * union_extent[1] * union_extent[2];
        auto chunk_coord = [&](int flat) {
          int c[kMaxRank];
          if (flat >= box) return make_int4(kPastBox, kPastBox, kPastBox, 0);
          unravel3(flat, union_extent, c);
          return make_int4(c[0], c[1], c[2], 0);
        };
        for (int first = run.lo / 64 * 64; first < run.hi; first += 64) {
          if (first < run.lo || first + 64 > run.hi) continue;  // partly outside the run: masked
          if (!spans_inside(chunk_coord(first), chunk_coord(first + 63), common, union_extent)) continue;
          for (int flat = first; flat < first + 64; ++flat) {
            int y[kMaxRank];
            box_coords(flat, union_lo, union_extent, y);
            if (!attends(window, y)) return "an unmasked chunk holds a key a row does not attend";
          }
        }
      }
    }
  }
  for (int count : seen)
    if (count != 1) return "a token is not in exactly one half of a pair";
  return "ok";
}

}  // namespace

int main() {
  int pattern;
  while (std::scanf("%d", &pattern) == 1) {
    AttentionParams p;
    p.pattern = static_cast<Pattern>(pattern);
    for (int a = 0; a < kMaxRank; ++a) {
      AxisParams& x = p.axis[a];
      std::scanf("%d %d %d %d %d %d", &x.length, &x.window, &x.stride, &x.dilation, &x.causal, &x.shift);
    }
    const char* verdict = "ok";
    for (const char* v : {check(p, true), check(p, false), check_pairs(p)})
      if (verdict[0] == 'o' && verdict[1] == 'k') verdict = v;
    std::printf("%s\n", verdict);
  }
  return 0;
}
