// model/rope.cu - Llama's rotary position tables on the host (model/rope.h).
#include "model/rope.h"

#include <cmath>

void rope_tables(std::vector<float>& cos_table, std::vector<float>& sin_table, int maxT, int HS,
                 double theta) {
  const int half = HS / 2;
  cos_table.assign((size_t)maxT * half, 0.0f);
  sin_table.assign((size_t)maxT * half, 0.0f);
  for (int j = 0; j < half; j++) {
    const double inv_freq = std::pow(theta, -2.0 * j / HS);
    for (int p = 0; p < maxT; p++) {
      const double angle = p * inv_freq;
      cos_table[(size_t)p * half + j] = (float)std::cos(angle);
      sin_table[(size_t)p * half + j] = (float)std::sin(angle);
    }
  }
}
