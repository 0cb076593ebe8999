// Host check of csrc/fragment_sources.cuh (the ldmatrix addressing of mma_fragments.cuh), for
// tests/test_cuda_build.py: emulates ldmatrix(.trans) as the PTX ISA defines it on the row
// addresses the *_source functions give each lane, and compares every lane's registers with the
// m16n8k16 A / B fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16"). Prints "ok" or
// the first mismatch.
#include <cstdint>
#include <cstdio>

#include "fragment_sources.cuh"

using haloattn::TileCoord;

namespace {

constexpr int kRows = 48, kCols = 48;
uint16_t tile[kRows][kCols];

uint32_t pack(uint16_t lo, uint16_t hi) { return lo | (static_cast<uint32_t>(hi) << 16); }

// ldmatrix .x4: matrix m's row r starts at the address lane 8 m + r supplies.
void ldmatrix(const TileCoord (&address)[32], bool trans, uint32_t (&regs)[32][4]) {
  for (int lane = 0; lane < 32; ++lane)
    for (int m = 0; m < 4; ++m) {
      const int r = lane / 4, c = 2 * (lane % 4);
      if (!trans) {
        const TileCoord row = address[8 * m + r];
        regs[lane][m] = pack(tile[row.row][row.col + c], tile[row.row][row.col + c + 1]);
      } else {
        const TileCoord row0 = address[8 * m + c], row1 = address[8 * m + c + 1];
        regs[lane][m] = pack(tile[row0.row][row0.col + r], tile[row1.row][row1.col + r]);
      }
    }
}

bool check_a(int row0, int k0) {
  TileCoord address[32];
  for (int lane = 0; lane < 32; ++lane) address[lane] = haloattn::a_source(lane, row0, k0);
  uint32_t regs[32][4];
  ldmatrix(address, false, regs);
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, t = lane % 4;
    const int rows[4] = {g, g + 8, g, g + 8}, cols[4] = {2 * t, 2 * t, 2 * t + 8, 2 * t + 8};
    for (int i = 0; i < 4; ++i) {
      const uint16_t* p = &tile[row0 + rows[i]][k0 + cols[i]];
      if (regs[lane][i] != pack(p[0], p[1])) return false;
    }
  }
  return true;
}

// B fragments (b0, b1) of n-tiles n0 and n0 + 8; `n_major`: tile[n][k], else tile[k][n].
bool check_b(int n0, int k0, bool n_major) {
  TileCoord address[32];
  for (int lane = 0; lane < 32; ++lane)
    address[lane] = n_major ? haloattn::b_nk_source(lane, n0, k0) : haloattn::b_kn_source(lane, k0, n0);
  uint32_t regs[32][4];
  ldmatrix(address, !n_major, regs);
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, t = lane % 4;
    for (int j = 0; j < 2; ++j)
      for (int half = 0; half < 2; ++half) {
        const int n = n0 + 8 * j + g, k = k0 + 2 * t + 8 * half;
        const uint32_t expected = n_major ? pack(tile[n][k], tile[n][k + 1]) : pack(tile[k][n], tile[k + 1][n]);
        if (regs[lane][2 * j + half] != expected) return false;
      }
  }
  return true;
}

}  // namespace

int main() {
  for (int r = 0; r < kRows; ++r)
    for (int c = 0; c < kCols; ++c) tile[r][c] = static_cast<uint16_t>(r * 256 + c);
  for (int r0 = 0; r0 <= 16; r0 += 16)
    for (int k0 = 0; k0 <= 16; k0 += 16) {
      if (!check_a(r0, k0)) return std::printf("A fragment mismatch at %d %d\n", r0, k0), 0;
      if (!check_b(r0, k0, true)) return std::printf("B (n-major) fragment mismatch at %d %d\n", r0, k0), 0;
      if (!check_b(r0, k0, false)) return std::printf("B (k-major) fragment mismatch at %d %d\n", r0, k0), 0;
    }
  std::printf("ok\n");
  return 0;
}
