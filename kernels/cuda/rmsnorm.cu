// kernels/cuda/rmsnorm.cu - RMSNorm over the last dimension (Llama's norm: no mean, no bias),
// forward and backward; the contract is in kernels/ops_decls.h.
//
// Forward: one warp per row, two sweeps: the sum of squares (fp32 per lane, warp-reduced), then
// out = x * rstd * weight from a streaming load (the second read of a row hits L1). rstd =
// 1/sqrt(mean(x^2) + eps) is saved for the backward pass.
//
// Backward, for each row n (xhat = x * rstd, g = dout * weight):
//   dinp    += rstd * (g - xhat * mean_c(g * xhat))      (the residual add fused, as LayerNorm's)
//   dweight += dout * xhat                               (summed over all rows)
// One warp per row (two sweeps: the row mean, then dinp). The weight gradient is a column sum,
// made reproducible without float atomics exactly as layernorm.cu does it (per-warp shared-memory
// accumulators, per-block partials, a fixed-order sum: kernels/cuda/norm_backward.cuh).
//
// Rows whose width C is not a multiple of the 16-byte pack (4 floats, 8 bf16), or unaligned
// pointers, take the same kernels with a pack of one element.
#include <algorithm>

#include "kernels/cuda/norm_backward.cuh"

namespace ops {
namespace {

constexpr int kForwardWarps = 8;  // rows per forward block

template <typename T, int W>
__global__ void rmsnorm_forward_kernel(T* __restrict__ out, float* __restrict__ rstd,
                                       const T* __restrict__ inp, const T* __restrict__ weight,
                                       int N, int C, float eps) {
  const int lane = threadIdx.x % 32;
  const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= N) return;  // warp-uniform
  const T* x = inp + (size_t)row * C;

  float sq = 0.0f;
  for (int c = lane * W; c < C; c += 32 * W) {
    float f[W];
    load_floats<W>(f, x + c);
#pragma unroll
    for (int k = 0; k < W; k++) sq += f[k] * f[k];
  }
  const float s = 1.0f / sqrtf(warp_reduce_sum(sq) / C + eps);

  T* o = out + (size_t)row * C;
  for (int c = lane * W; c < C; c += 32 * W) {
    float f[W], w[W];
    norm::load_floats_streaming<W>(f, x + c);
    load_floats<W>(w, weight + c);
#pragma unroll
    for (int k = 0; k < W; k++) f[k] = f[k] * s * w[k];
    store_floats<W>(o + c, f);
  }
  if (lane == 0 && rstd) rstd[row] = s;
}

// Shared memory: per warp, dweight[C]. Output: partials[g*C + c] for block g.
template <typename T, int W>
__global__ void rmsnorm_backward_kernel(T* dinp, float* __restrict__ partials,
                                        const T* __restrict__ dout, const T* __restrict__ inp,
                                        const T* __restrict__ weight,
                                        const float* __restrict__ rstd, int N, int C) {
  extern __shared__ float4 smem_raw[];  // float4 for 16-byte alignment
  float* smem = reinterpret_cast<float*>(smem_raw);
  const int warps = blockDim.x / 32;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  float* acc_dweight = smem + (size_t)warp * C;
  for (int c = lane * W; c < C; c += 32 * W)
#pragma unroll
    for (int k = 0; k < W; k++) acc_dweight[c + k] = 0.0f;
  // From here on each lane reads and writes only its own channels: no barrier until the end.

  for (int row = blockIdx.x * warps + warp; row < N; row += gridDim.x * warps) {
    const size_t offset = (size_t)row * C;
    const float s = rstd[row];
    float sum_g_xhat = 0.0f;
    for (int c = lane * W; c < C; c += 32 * W) {
      float d[W], x[W], w[W];
      load_floats<W>(d, dout + offset + c);
      load_floats<W>(x, inp + offset + c);
      load_floats<W>(w, weight + c);
#pragma unroll
      for (int k = 0; k < W; k++) sum_g_xhat += (d[k] * w[k]) * (x[k] * s);
    }
    const float mean_g_xhat = warp_reduce_sum(sum_g_xhat) / C;

    for (int c = lane * W; c < C; c += 32 * W) {
      float d[W], x[W], w[W], g[W], dw[W];
      norm::load_floats_streaming<W>(d, dout + offset + c);
      norm::load_floats_streaming<W>(x, inp + offset + c);
      load_floats<W>(w, weight + c);
      load_floats<W>(g, dinp + offset + c);
#pragma unroll
      for (int k = 0; k < W; k++) {
        const float xhat = x[k] * s;
        g[k] += (d[k] * w[k] - xhat * mean_g_xhat) * s;
        dw[k] = d[k] * xhat;
      }
      store_floats<W>(dinp + offset + c, g);
      norm::add_to_shared<W>(acc_dweight + c, dw);
    }
  }
  norm::write_block_partials(partials, smem, 1, C);
}

template <typename T, int W>
void rmsnorm_backward_typed(T* dinp, float* dweight, const T* dout, const T* inp, const T* weight,
                            const float* rstd, int N, int C, Stream s) {
  const int warps = norm::backward_warps("rmsnorm_backward", C, 1);
  const size_t smem = (size_t)warps * C * sizeof(float);
  const int blocks = (int)std::min<size_t>(ceil_div(N, warps), norm::kBackwardMaxBlocks);
  float* partials = static_cast<float*>(stream_scratch(s, (size_t)blocks * C * sizeof(float)));
  auto kernel = rmsnorm_backward_kernel<T, W>;
  if (smem > 48 * 1024)
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)smem));
  kernel<<<blocks, warps * 32, smem, s->stream>>>(dinp, partials, dout, inp, weight, rstd, N, C);
  LAUNCH_CHECK();
  norm::sum_partials(dweight, nullptr, partials, blocks, C, s);
}

}  // namespace

void rmsnorm_forward(void* out, float* rstd, const void* inp, const void* weight, int N, int C,
                     float eps, DType dt, Stream s) {
  OP_SPAN(rmsnorm_forward);
  if (is_dry(s)) return;
  if (N == 0 || C == 0) return;
  dispatch_dtype(dt, [&](auto tag) {
    using S = decltype(tag);
    constexpr int P = Pack128<S>::size;
    const bool vec = C % P == 0 && aligned16({out, inp, weight});
    const int blocks = (int)ceil_div(N, kForwardWarps);
    auto launch = [&](auto kernel) {
      kernel<<<blocks, kForwardWarps * 32, 0, s->stream>>>(
          static_cast<S*>(out), rstd, static_cast<const S*>(inp), static_cast<const S*>(weight),
          N, C, eps);
    };
    if (vec) launch(rmsnorm_forward_kernel<S, P>);
    else launch(rmsnorm_forward_kernel<S, 1>);
    LAUNCH_CHECK();
  });
}

void rmsnorm_backward(void* dinp, float* dweight, const void* dout, const void* inp,
                      const void* weight, const float* rstd, int N, int C, DType dt, Stream s) {
  OP_SPAN(rmsnorm_backward);
  if (is_dry(s)) return;
  if (N == 0 || C == 0) return;
  dispatch_dtype(dt, [&](auto tag) {
    using S = decltype(tag);
    constexpr int P = Pack128<S>::size;
    const bool vec = C % P == 0 && aligned16({dinp, dout, inp, weight});
    auto* di = static_cast<S*>(dinp);
    auto* d = static_cast<const S*>(dout);
    auto* x = static_cast<const S*>(inp);
    auto* w = static_cast<const S*>(weight);
    if (vec) rmsnorm_backward_typed<S, P>(di, dweight, d, x, w, rstd, N, C, s);
    else rmsnorm_backward_typed<S, 1>(di, dweight, d, x, w, rstd, N, C, s);
  });
}

}  // namespace ops
