// Checks csrc/fast_divisor.h on the host: Divisor(d).div(x) == x / d for every divisor 1..4096,
// every x below 4096 and at the top of the range, a spread of large divisors, and pseudo-random
// numerators up to 2^31 - 1. Prints "ok" or the first disagreement. Run by tests/test_cuda_build.py.
#include <cstdint>
#include <cstdio>

#include "fast_divisor.h"

namespace {

uint64_t state = 0x9e3779b97f4a7c15ull;
int next_numerator() {  // xorshift64*: numerators spread over [0, 2^31)
  state ^= state >> 12;
  state ^= state << 25;
  state ^= state >> 27;
  return static_cast<int>((state * 0x2545f4914f6cdd1dull) >> 33);
}

bool check(int d, int x) {
  const haloattn::Divisor divisor(d);
  if (divisor.div(x) == x / d) return true;
  std::printf("Divisor(%d).div(%d) = %d, expected %d\n", d, x, divisor.div(x), x / d);
  return false;
}

}  // namespace

int main() {
  for (int d = 1; d <= 4096; ++d) {
    for (int x = 0; x < 4096; ++x)
      if (!check(d, x)) return 0;
    for (int x : {0x7fffffff, 0x7ffffffe, 0x40000000, 0x3fffffff, d * (0x7fffffff / d), d * (0x7fffffff / d) - 1})
      if (!check(d, x)) return 0;
    for (int i = 0; i < 200; ++i)
      if (!check(d, next_numerator())) return 0;
  }
  for (int64_t d = 4097; d < 0x7fffffff; d = d * 3 / 2 + 1)
    for (int i = 0; i < 2000; ++i)
      if (!check(static_cast<int>(d), next_numerator())) return 0;
  for (int d : {0x7fffffff, 0x40000000, 0x3fffffff})
    for (int x : {0, 1, d - 1, d, 0x7fffffff})
      if (!check(d, x)) return 0;
  std::printf("ok\n");
  return 0;
}
