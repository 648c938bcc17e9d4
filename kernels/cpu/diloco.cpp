// kernels/cpu/diloco.cpp - DiLoCo's outer step on the CPU backend (parallel/diloco.h): the outer
// gradient (synchronised weights minus the island's) and the Nesterov update of the synchronised
// weights, which the island's weights then take. Elementwise over OpenMP threads; every product
// and sum is rounded once in the order of kernels/ops_decls.h (x86-64 without -march has no FMA
// to contract into), which the CUDA backend reproduces bit for bit.
#include "kernels/cpu/cpu_common.h"

namespace ops {

void diloco_outer_delta(float* delta, const float* sync, const float* weights, size_t n,
                        Stream s) {
  if (is_dry(s)) return;
#pragma omp parallel for schedule(static) if (n > CPU_PARALLEL_MIN)
  for (size_t i = 0; i < n; i++) delta[i] = sync[i] - weights[i];
}

void diloco_outer_step(float* sync, float* m, float* weights, const float* delta_sum, size_t n,
                       float inv_islands, float lr, float mu, Stream s) {
  if (is_dry(s)) return;
#pragma omp parallel for schedule(static) if (n > CPU_PARALLEL_MIN)
  for (size_t i = 0; i < n; i++) {
    const float g = delta_sum[i] * inv_islands;
    const float mi = mu * m[i] + g;
    m[i] = mi;
    const float w = sync[i] - lr * (g + mu * mi);
    sync[i] = w;
    weights[i] = w;
  }
}

}  // namespace ops
