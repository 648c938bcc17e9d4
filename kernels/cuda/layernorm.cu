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
//
// Rows whose width C is not a multiple of the 16-byte pack (4 floats, 8 bf16), or unaligned
// pointers, take the same kernels with a pack of one element.
#include <algorithm>

#include "kernels/cuda/cuda_common.cuh"

namespace ops {
namespace {

constexpr float kEps = 1e-5f;
constexpr int kForwardWarps = 8;                      // rows per forward block
constexpr int kBackwardMaxWarps = 8;                  // rows in flight per backward block
constexpr int kBackwardMaxBlocks = 256;               // partial rows of dweight/dbias
constexpr size_t kBackwardSmemBudget = 96 * 1024;     // per block, to keep 2+ blocks per SM
constexpr size_t kBackwardSmemLimit = 200 * 1024;     // under the 227 KiB opt-in of Hopper
constexpr int kReduceLanes = 8;                       // partial reduction: 32 channels x 8 lanes

template <int W, typename T>
__device__ __forceinline__ void load_floats_streaming(float (&f)[W], const T* p) {
  if constexpr (W == 1) {
    f[0] = to_float(__ldcs(p));
  } else {
    Pack128<T> x = load128cs(p);
#pragma unroll
    for (int k = 0; k < W; k++) f[k] = to_float(x[k]);
  }
}


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
    load_floats_streaming<W>(f, x + c);
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
// acc[0..W) += f in shared memory (16-byte accesses when W is a multiple of 4: then acc is
// 16-byte aligned because C is a multiple of W).
template <int W>
__device__ __forceinline__ void add_to_shared(float* acc, const float (&f)[W]) {
  if constexpr (W % 4 == 0) {
#pragma unroll
    for (int k = 0; k < W; k += 4) {
      float4 a = *reinterpret_cast<float4*>(acc + k);
      a.x += f[k];
      a.y += f[k + 1];
      a.z += f[k + 2];
      a.w += f[k + 3];
      *reinterpret_cast<float4*>(acc + k) = a;
    }
  } else {
#pragma unroll
    for (int k = 0; k < W; k++) acc[k] += f[k];
  }
}

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
      load_floats_streaming<W>(d, dout + offset + c);
      load_floats_streaming<W>(x, inp + offset + c);
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
      add_to_shared<W>(acc_dweight + c, dw);
      add_to_shared<W>(acc_dbias + c, d);
    }
  }

  __syncthreads();
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    float dw = 0.0f, db = 0.0f;
    for (int w = 0; w < warps; w++) {
      dw += smem[(size_t)w * 2 * C + c];
      db += smem[(size_t)w * 2 * C + C + c];
    }
    partials[(size_t)blockIdx.x * C + c] = dw;
    partials[(size_t)(gridDim.x + blockIdx.x) * C + c] = db;
  }
}

// dweight[c] += sum_g partials[g][c], dbias likewise, g in a fixed order: lane y of a 32x8 block
// sums g = y, y+8, ..., then lane 0 adds the 8 lane sums in lane order.
__global__ void layernorm_param_grad_kernel(float* __restrict__ dweight, float* __restrict__ dbias,
                                            const float* __restrict__ partials, int G, int C) {
  __shared__ float lane_dw[kReduceLanes][32];
  __shared__ float lane_db[kReduceLanes][32];
  const int c = blockIdx.x * 32 + threadIdx.x;
  float dw = 0.0f, db = 0.0f;
  if (c < C) {
    for (int g = threadIdx.y; g < G; g += kReduceLanes) {
      dw += partials[(size_t)g * C + c];
      db += partials[(size_t)(G + g) * C + c];
    }
  }
  lane_dw[threadIdx.y][threadIdx.x] = dw;
  lane_db[threadIdx.y][threadIdx.x] = db;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float sw = 0.0f, sb = 0.0f;
    for (int y = 0; y < kReduceLanes; y++) {
      sw += lane_dw[y][threadIdx.x];
      sb += lane_db[y][threadIdx.x];
    }
    dweight[c] += sw;
    dbias[c] += sb;
  }
}

// Warps per backward block: as many as the shared-memory budget allows (2*C floats each).
int backward_warps(int C) {
  const size_t per_warp = 2 * (size_t)C * sizeof(float);
  CHECK(per_warp <= kBackwardSmemLimit,
        "layernorm_backward: C=%d needs %zu bytes of shared memory per warp, more than %zu", C,
        per_warp, kBackwardSmemLimit);
  size_t warps = kBackwardSmemBudget / per_warp;
  if (warps < 1) warps = 1;
  if (warps > kBackwardMaxWarps) warps = kBackwardMaxWarps;
  return (int)warps;
}

template <typename T, int W>
void layernorm_backward_typed(T* dinp, float* dweight, float* dbias, const T* dout, const T* inp,
                              const T* weight, const float* mean, const float* rstd, int N, int C,
                              Stream s) {
  const int warps = backward_warps(C);
  const size_t smem = (size_t)warps * 2 * C * sizeof(float);
  const int blocks = (int)std::min<size_t>(ceil_div(N, warps), kBackwardMaxBlocks);
  float* partials = static_cast<float*>(stream_scratch(s, 2 * (size_t)blocks * C * sizeof(float)));
  auto kernel = layernorm_backward_kernel<T, W>;
  if (smem > 48 * 1024)
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)smem));
  kernel<<<blocks, warps * 32, smem, s->stream>>>(dinp, partials, dout, inp, weight, mean, rstd,
                                                  N, C);
  LAUNCH_CHECK();
  dim3 block(32, kReduceLanes);
  layernorm_param_grad_kernel<<<(int)ceil_div(C, 32), block, 0, s->stream>>>(dweight, dbias,
                                                                              partials, blocks, C);
  LAUNCH_CHECK();
}

}  // namespace

void layernorm_forward(void* out, float* mean, float* rstd, const void* inp, const void* weight,
                       const void* bias, int N, int C, DType dt, Stream s) {
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
