// The Hopper kernels' work on a problem, counted on the host with the kernels' own tiling code
// (csrc/pair_tiles.cuh, key_tiles.cuh, pair_tiling.h), for the query-major walk (forward and dQ) and the
// key-major one (dK/dV, rows are keys, partner tiles hold queries): the pair and partner tile
// shapes, the pairs their wgmma computes (64 rows per half times 64 partners per tile the half
// visits) per attended pair, the share of visited tiles that need a mask, and the visited tiles
// per run (a half's tiles that are consecutive in the walk's row-major order: each run is one
// software pipeline, filled and drained). Reads problems like tests/cuda_host/
// tiling_check.cu ("pattern" then per padded axis "length window stride dilation causal shift")
// and prints one line per problem. Driven by benchmarks/hopper_work.py.
#include <cstdio>

#include "../../tests/cuda_host/problem_input.h"
#include "key_tiles.cuh"
#include "pair_tiles.cuh"
#include "pair_tiling.h"

using namespace haloattn;

int main() {
  AttentionParams p;
  while (read_problem(p)) {
    for (const bool inverse : {false, true}) {
      TileShape shape;
      KeyTiling kt;
      if (!choose_pair_tiling(p, inverse, shape, kt)) {
        std::printf("no partner tiling ");
        continue;
      }
      double attended = 0, computed = 0, tiles_visited = 0, tiles_masked = 0, runs = 0;
      for (int64_t pair = 0; pair < count_tiles(p, shape, 1); ++pair) {
        const PairTiles t = pair_tiles(p, shape, kt, pair, inverse);
        if (t.work.empty) continue;
        for (int half = 0; half < 2; ++half) {
          const TileHalf h = tile_half(t.work, shape, half);
          if (h.work.empty) continue;
          const HalfTiles v = half_tiles(p, t, h, kt, inverse);
          double own = 1, full = 1;
          for (int a = 0; a < kMaxRank; ++a) {
            own *= visited_tiles(v, a);
            full *= unmasked_tiles(v, a);
          }
          computed += own * kKeyTileTokens * 64;
          tiles_visited += own;
          tiles_masked += own - full;
          TileCursor cursor{{0, 0, 0}};
          bool in_run = false;
          for (int c = 0; c < t.chunks; ++c, step_tile(cursor, t.tiles)) {
            const bool visited = tile_in(cursor, v.first, v.end);
            runs += visited && !in_run;
            in_run = visited;
          }
          for (int r = 0; r < h.rows; ++r) {
            int x[kMaxRank];
            if (!tile_row_coords(t.work, shape, h.first_row + r, x)) continue;
            const RowWindow w = query_window(p, t.work, x, true, inverse);
            attended += double(w.hi[0] - w.lo[0]) * (w.hi[1] - w.lo[1]) * (w.hi[2] - w.lo[2]);
          }
        }
      }
      std::printf("rows %dx%dx%d partners %dx%dx%d computed/attended %.3f masked %.2f tiles/run %.1f ", shape.n[0],
                  shape.n[1], shape.n[2], kt.n[0], kt.n[1], kt.n[2], computed / attended, tiles_masked / tiles_visited,
                  tiles_visited / runs);
    }
    std::printf("\n");
  }
  return 0;
}
