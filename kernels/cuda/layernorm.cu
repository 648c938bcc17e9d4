// kernels/cuda/layernorm.cu - LayerNorm over the last dimension (eps 1e-5), forward and backward.
//
// Forward: one warp per row. Three sweeps over the row: the sum (mean), the sum of squared
// deviations (variance, two-pass for accuracy), then the normalised output; only the first sweep
// comes from HBM, the others hit L1 (a row is at most a few KiB), and the last one is a streaming
// load. mean and rstd are saved for the backward pass.
//
// Backward, for each row n (xhat = (x - mean) * rstd, dnorm = dout * weight):
//   dinp    += (dnorm - mean_c(dnorm) - xhat * mean_c(dnorm * xhat)) * rstd
//   dweight += dout * xhat,   dbias += dout           (sums over all rows)
// One warp per row again (two sweeps: the two row means, then dinp). The weight and bias
// gradients are the hard part: a column sum over N rows that must be reproducible, so no float
// atomics. Each warp keeps its own fp32 accumulators for the whole row width in shared memory
// (a lane always owns the same channels, so no synchronisation is needed while accumulating);
// at the end a block adds its warps in warp order and writes one partial row per block into the
// stream's scratch. A second kernel adds the per-block partials in a fixed order into dweight and
// dbias. The number of blocks depends only on N and C, so the result is bitwise reproducible.
// (That machinery is shared with rmsnorm.cu: kernels/cuda/norm_backward.cuh.)
//
// Rows whose width C is not a multiple of the 16-byte pack (4 floats, 8 bf16), or unaligned
// pointers, take the same kernels with a pack of one element.
#include <algorithm>

#include "kernels/cuda/norm_backward.cuh"

namespace ops {
namespace {

constexpr float kEps = 1e-5f;
constexpr int kForwardWarps = 8;                      // rows per forward block
// ---------------------------------------------------------------------------------------------
// Forward
// ---------------------------------------------------------------------------------------------
template <typename T, int W>
__global__ void layernorm_forward_kernel(T* __restrict__ out, float* __restrict__ mean,
                                         float* __restrict__ rstd, const T* __restrict__ inp,
                                         const T* __restrict__ weight, const T* __restrict__ bias,
                                         int N, int C) {
  const int lane = threadIdx.x % 32;
  const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= N) return;  // warp-uniform
  const T* x = inp + (size_t)row * C;

  float sum = 0.0f;
  for (int c = lane * W; c < C; c += 32 * W) {
    float f[W];
    load_floats<W>(f, x + c);
#pragma unroll
    for (int k = 0; k < W; k++) sum += f[k];
  }
  const float m = warp_reduce_sum(sum) / C;

  float sq = 0.0f;
  for (int c = lane * W; c < C; c += 32 * W) {
    float f[W];
    load_floats<W>(f, x + c);
#pragma unroll
    for (int k = 0; k < W; k++) sq += (f[k] - m) * (f[k] - m);
  }
  const float s = 1.0f / sqrtf(warp_reduce_sum(sq) / C + kEps);

  T* o = out + (size_t)row * C;
  for (int c = lane * W; c < C; c += 32 * W) {
    float f[W], w[W], b[W];
    norm::load_floats_streaming<W>(f, x + c);
    load_floats<W>(w, weight + c);
    load_floats<W>(b, bias + c);
#pragma unroll
    for (int k = 0; k < W; k++) f[k] = (f[k] - m) * s * w[k] + b[k];
    store_floats<W>(o + c, f);
  }
  if (lane == 0) {
    if (mean) mean[row] = m;
    if (rstd) rstd[row] = s;
  }
}

// ---------------------------------------------------------------------------------------------
// Backward
// ---------------------------------------------------------------------------------------------
// Shared memory: per warp, dweight[C] then dbias[C]. Output: partials[g*C + c] (dweight) and
// partials[(gridDim.x + g)*C + c] (dbias) for block g.
template <typename T, int W>
__global__ void layernorm_backward_kernel(T* dinp, float* __restrict__ partials,
                                          const T* __restrict__ dout, const T* __restrict__ inp,
                                          const T* __restrict__ weight,
                                          const float* __restrict__ mean,
                                          const float* __restrict__ rstd, int N, int C) {
  extern __shared__ float4 smem_raw[];  // float4 for 16-byte alignment
  float* smem = reinterpret_cast<float*>(smem_raw);
  const int warps = blockDim.x / 32;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  float* acc_dweight = smem + (size_t)warp * 2 * C;
  float* acc_dbias = acc_dweight + C;
  for (int c = lane * W; c < C; c += 32 * W)
#pragma unroll
    for (int k = 0; k < W; k++) acc_dweight[c + k] = acc_dbias[c + k] = 0.0f;
  // From here on each lane reads and writes only its own channels: no barrier until the end.

  for (int row = blockIdx.x * warps + warp; row < N; row += gridDim.x * warps) {
    const size_t offset = (size_t)row * C;
    const float m = mean[row];
    const float s = rstd[row];
    float sum_dnorm = 0.0f, sum_dnorm_xhat = 0.0f;
    for (int c = lane * W; c < C; c += 32 * W) {
      float d[W], x[W], w[W];
      load_floats<W>(d, dout + offset + c);
      load_floats<W>(x, inp + offset + c);
      load_floats<W>(w, weight + c);
#pragma unroll
      for (int k = 0; k < W; k++) {
        float dnorm = d[k] * w[k];
        sum_dnorm += dnorm;
        sum_dnorm_xhat += dnorm * ((x[k] - m) * s);
      }
    }
    const float mean_dnorm = warp_reduce_sum(sum_dnorm) / C;
    const float mean_dnorm_xhat = warp_reduce_sum(sum_dnorm_xhat) / C;

    for (int c = lane * W; c < C; c += 32 * W) {
      float d[W], x[W], w[W], g[W], dw[W];
      norm::load_floats_streaming<W>(d, dout + offset + c);
      norm::load_floats_streaming<W>(x, inp + offset + c);
      load_floats<W>(w, weight + c);
      load_floats<W>(g, dinp + offset + c);
#pragma unroll
      for (int k = 0; k < W; k++) {
        float xhat = (x[k] - m) * s;
        float dnorm = d[k] * w[k];
        g[k] += (dnorm - mean_dnorm - xhat * mean_dnorm_xhat) * s;
        dw[k] = d[k] * xhat;
      }
      store_floats<W>(dinp + offset + c, g);
      norm::add_to_shared<W>(acc_dweight + c, dw);
      norm::add_to_shared<W>(acc_dbias + c, d);
    }
  }

  norm::write_block_partials(partials, smem, 2, C);
}

template <typename T, int W>
void layernorm_backward_typed(T* dinp, float* dweight, float* dbias, const T* dout, const T* inp,
                              const T* weight, const float* mean, const float* rstd, int N, int C,
                              Stream s) {
  const int warps = norm::backward_warps("layernorm_backward", C, 2);
  const size_t smem = (size_t)warps * 2 * C * sizeof(float);
  const int blocks = (int)std::min<size_t>(ceil_div(N, warps), norm::kBackwardMaxBlocks);
  float* partials = static_cast<float*>(stream_scratch(s, 2 * (size_t)blocks * C * sizeof(float)));
  auto kernel = layernorm_backward_kernel<T, W>;
  if (smem > 48 * 1024)
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)smem));
  kernel<<<blocks, warps * 32, smem, s->stream>>>(dinp, partials, dout, inp, weight, mean, rstd,
                                                  N, C);
  LAUNCH_CHECK();
  norm::sum_partials(dweight, dbias, partials, blocks, C, s);
}

}  // namespace

void layernorm_forward(void* out, float* mean, float* rstd, const void* inp, const void* weight,
                       const void* bias, int N, int C, DType dt, Stream s) {
  OP_SPAN(layernorm_forward);
  if (is_dry(s)) return;
  if (N == 0 || C == 0) return;
  dispatch_dtype(dt, [&](auto tag) {
    using S = decltype(tag);
    constexpr int P = Pack128<S>::size;
    const bool vec = C % P == 0 && aligned16(out) && aligned16(inp) && aligned16(weight) &&
                     aligned16(bias);
    const int blocks = (int)ceil_div(N, kForwardWarps);
    auto args = [&](auto kernel) {
      kernel<<<blocks, kForwardWarps * 32, 0, s->stream>>>(
          static_cast<S*>(out), mean, rstd, static_cast<const S*>(inp),
          static_cast<const S*>(weight), static_cast<const S*>(bias), N, C);
    };
    if (vec) args(layernorm_forward_kernel<S, P>);
    else args(layernorm_forward_kernel<S, 1>);
    LAUNCH_CHECK();
  });
}

void layernorm_backward(void* dinp, float* dweight, float* dbias, const void* dout,
                        const void* inp, const void* weight, const float* mean, const float* rstd,
                        int N, int C, DType dt, Stream s) {
  OP_SPAN(layernorm_backward);
  if (is_dry(s)) return;
  if (N == 0 || C == 0) return;
  dispatch_dtype(dt, [&](auto tag) {
    using S = decltype(tag);
    constexpr int P = Pack128<S>::size;
    const bool vec = C % P == 0 && aligned16(dinp) && aligned16(dout) && aligned16(inp) &&
                     aligned16(weight);
    auto* di = static_cast<S*>(dinp);
    auto* d = static_cast<const S*>(dout);
    auto* x = static_cast<const S*>(inp);
    auto* w = static_cast<const S*>(weight);
    if (vec) layernorm_backward_typed<S, P>(di, dweight, dbias, d, x, w, mean, rstd, N, C, s);
    else layernorm_backward_typed<S, 1>(di, dweight, dbias, d, x, w, mean, rstd, N, C, s);
  });
}

}  // namespace ops
