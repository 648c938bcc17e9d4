// kernels/cuda/diloco.cu - DiLoCo's outer step (parallel/diloco.h) on the device: the outer
// gradient (synchronised weights minus the island's) and the Nesterov update of the synchronised
// weights, which the island's weights then take (the formulas: kernels/ops_decls.h).
//
// Elementwise, grid-stride, one value per thread and step: the step runs once every diloco_every
// training steps over each rank's shard, so the scalar path is enough (it is memory-bound
// either way). Every product and sum is an explicitly rounded intrinsic (__fmul_rn, __fadd_rn,
// __fsub_rn): nvcc would otherwise contract mu * m + g into an FMA, and the CPU backend
// (kernels/cpu/diloco.cpp) computes each rounding separately; the two agree bit for bit.
#include "kernels/cuda/cuda_common.cuh"

namespace ops {
namespace {

constexpr int kThreads = 256;

__global__ void outer_delta_kernel(float* __restrict__ delta, const float* __restrict__ sync,
                                   const float* __restrict__ weights, size_t n) {
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += stride)
    delta[i] = __fsub_rn(sync[i], weights[i]);
}

// weights may not alias sync or m (they are separate buffers of the parameter store).
__global__ void outer_step_kernel(float* __restrict__ sync, float* __restrict__ m,
                                  float* __restrict__ weights, const float* __restrict__ delta_sum,
                                  size_t n, float inv_islands, float lr, float mu) {
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += stride) {
    const float g = __fmul_rn(delta_sum[i], inv_islands);
    const float mi = __fadd_rn(__fmul_rn(mu, m[i]), g);
    m[i] = mi;
    const float w = __fsub_rn(sync[i], __fmul_rn(lr, __fadd_rn(g, __fmul_rn(mu, mi))));
    sync[i] = w;
    weights[i] = w;
  }
}

}  // namespace

void diloco_outer_delta(float* delta, const float* sync, const float* weights, size_t n,
                        Stream s) {
  OP_SPAN(diloco_outer_delta);
  if (is_dry(s)) return;
  if (n == 0) return;
  const ElementwiseSplit sp = elementwise_split(n, false, kThreads, 1);
  outer_delta_kernel<<<sp.blocks, kThreads, 0, s->stream>>>(delta, sync, weights, n);
  LAUNCH_CHECK();
}

void diloco_outer_step(float* sync, float* m, float* weights, const float* delta_sum, size_t n,
                       float inv_islands, float lr, float mu, Stream s) {
  OP_SPAN(diloco_outer_step);
  if (is_dry(s)) return;
  if (n == 0) return;
  const ElementwiseSplit sp = elementwise_split(n, false, kThreads, 1);
  outer_step_kernel<<<sp.blocks, kThreads, 0, s->stream>>>(sync, m, weights, delta_sum, n,
                                                           inv_islands, lr, mu);
  LAUNCH_CHECK();
}

}  // namespace ops
