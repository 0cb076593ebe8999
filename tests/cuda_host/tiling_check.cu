// Host check of the kernels' work decomposition (csrc/token_tiles.cuh, row_windows.cuh), for
// tests/test_cuda_build.py. For each problem read from stdin ("pattern" then per axis of the
// padded rank-3 grid "length window stride dilation causal shift"), it walks the CTAs exactly as
// the kernels do and checks that:
//   forward / dQ: every query is in exactly one tile, and the tile's key box holds every key the
//                 query attends (the count of box keys passing `attends` equals the brute force);
//                 where tile_shares_one_window, every query attends the whole box (no mask);
//   dK/dV:       every key is in exactly one tile, and the tile's query box holds every query
//                 that attends it;
//   box walks:    a BoxCursor (box_cursor.cuh) advanced in the steps the Hopper kernel takes
//                 lands where unravelling the flat position does, and is past the box exactly
//                 when the position is.
// Prints "ok" or the first mismatch, one line per problem.
#include <cstdio>
#include <vector>

#include "box_cursor.cuh"
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
    }
  }
  for (int i = 0; i < tokens; ++i)
    if (seen[i] != 1) return "a token is not in exactly one tile";
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
    const char* fwd = check(p, true);
    const char* bwd = check(p, false);
    std::printf("%s\n", fwd[0] == 'o' && fwd[1] == 'k' ? bwd : fwd);
  }
  return 0;
}
