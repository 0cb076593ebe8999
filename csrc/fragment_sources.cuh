// Which shared-memory row each lane points ldmatrix at, for the MMA fragments of
// mma_fragments.cuh. Kept free of CUTLASS so host tests can include it.
#pragma once

namespace haloattn {

// Fragments come from shared memory through ldmatrix: four 8x8 16-bit matrices per instruction,
// lane l giving the address of row l % 8 of matrix l / 8; lane l receives row l / 4, columns
// 2 (l % 4) and 2 (l % 4) + 1 of each matrix (.trans: the transposed element pair). The *_source
// functions say which tile element each lane's row address points at; they are host-callable so
// tests/cuda_host/fragment_check.cu can check them against the MMA layouts (mma_fragments.cuh).
struct TileCoord {
  int row, col;
};

// A (16 x 16 at row0, k0) of a row-major tile: matrices (rows +0, cols +0), (+8, +0), (+0, +8), (+8, +8).
__host__ __device__ inline TileCoord a_source(int lane, int row0, int k0) {
  return {row0 + (lane & 15), k0 + (lane >> 4) * 8};
}

// B for two n-tiles (n0, n0 + 8) x one k-step (k0) of a tile stored tile[n][k]:
// matrices (n +0, k +0) (n +0, k +8) (n +8, k +0) (n +8, k +8) = b[0][0], b[0][1], b[1][0], b[1][1].
__host__ __device__ inline TileCoord b_nk_source(int lane, int n0, int k0) {
  const int m = lane >> 3;
  return {n0 + (lane & 7) + (m >> 1) * 8, k0 + (m & 1) * 8};
}

// The same two n-tiles from a tile stored tile[k][n], transposed on load:
// matrices (k +0, n +0) (k +8, n +0) (k +0, n +8) (k +8, n +8) = b[0][0], b[0][1], b[1][0], b[1][1].
__host__ __device__ inline TileCoord b_kn_source(int lane, int k0, int n0) {
  const int m = lane >> 3;
  return {k0 + (lane & 7) + (m & 1) * 8, n0 + (m >> 1) * 8};
}

}  // namespace haloattn
