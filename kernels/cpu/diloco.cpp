// kernels/cpu/diloco.cpp - DiLoCo's outer step on the CPU backend (parallel/diloco.h): the outer
// gradient (synchronised weights minus the island's) and the Nesterov update of the synchronised
// weights, which the island's weights then take. The host loops of kernels/host_diloco.cpp (every
// product and sum rounded once in the order of kernels/ops_decls.h), which the outer step under
// optimizer offload (parallel/diloco.cu) runs too and the CUDA backend reproduces bit for bit.
#include "kernels/cpu/cpu_common.h"
#include "kernels/host_diloco.h"

namespace ops {

void diloco_outer_delta(float* delta, const float* sync, const float* weights, size_t n,
                        Stream s) {
  OP_SPAN(diloco_outer_delta);
  if (is_dry(s)) return;
  host_diloco_outer_delta(delta, sync, weights, n);
}

void diloco_outer_step(float* sync, float* m, float* weights, const float* delta_sum, size_t n,
                       float inv_islands, float lr, float mu, Stream s) {
  OP_SPAN(diloco_outer_step);
  if (is_dry(s)) return;
  host_diloco_outer_step(sync, m, weights, delta_sum, n, inv_islands, lr, mu, nullptr, DType::F32);
}

}  // namespace ops
