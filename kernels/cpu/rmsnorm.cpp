// kernels/cpu/rmsnorm.cpp - RMSNorm over the last dimension (Llama's norm, no mean, no bias),
// forward and backward; the contract is in kernels/ops_decls.h.
//
// Forward, rows in parallel: the mean square in double, saved as fp32 rstd = 1/sqrt(ms + eps);
// out = x * rstd * weight in fp32 with the saved fp32 rstd (so the backward sees exactly the
// normalisation the forward did), rounded once to the storage type.
//
// Backward. With xhat = x * rstd and g = weight * dout, y = xhat * weight and
// d rstd / d x_k = -rstd^3 x_k / C, so
//   dx_k = rstd * (g_k - xhat_k * mean_c(g_c * xhat_c))
// (LayerNorm's formula without its mean terms). Two passes, nothing shared between threads:
//   1. rows in parallel: dinp += dx (the residual stream's gradient: the add is fused; the row
//      mean in double);
//   2. channel slices in parallel: dweight += sum_n dout * xhat, each channel summed over the
//      rows in order in double. Bitwise the same for any thread count.
#include <vector>

#include "kernels/cpu/cpu_common.h"

namespace ops {
namespace cpu {
namespace {

constexpr int kChannelChunk = 64;

template <typename T>
void rmsnorm_forward_typed(T* out, float* rstd, const T* inp, const T* weight, int N, int C,
                           float eps) {
#pragma omp parallel if ((size_t)N * C > CPU_PARALLEL_MIN)
  {
    std::vector<float> x(C), w(C);
    load_row(w.data(), weight, C);
#pragma omp for schedule(static)
    for (int n = 0; n < N; n++) {
      load_row(x.data(), inp + (size_t)n * C, C);
      double sq = 0.0;
      for (int c = 0; c < C; c++) sq += (double)x[c] * x[c];
      const float r = (float)(1.0 / std::sqrt(sq / C + (double)eps));
      T* o = out + (size_t)n * C;
      for (int c = 0; c < C; c++) store(o, c, x[c] * r * w[c]);
      rstd[n] = r;
    }
  }
}

template <typename T>
void rmsnorm_backward_inputs(T* dinp, const T* dout, const T* inp, const T* weight,
                             const float* rstd, int N, int C) {
#pragma omp parallel if ((size_t)N * C > CPU_PARALLEL_MIN)
  {
    std::vector<float> w(C), xhat(C), g(C);
    load_row(w.data(), weight, C);
#pragma omp for schedule(static)
    for (int n = 0; n < N; n++) {
      const T* x = inp + (size_t)n * C;
      const T* d = dout + (size_t)n * C;
      double g_xhat_sum = 0.0;
      for (int c = 0; c < C; c++) {
        xhat[c] = load(x, c) * rstd[n];
        g[c] = w[c] * load(d, c);
        g_xhat_sum += (double)g[c] * xhat[c];
      }
      const float g_xhat_mean = (float)(g_xhat_sum / C);
      T* di = dinp + (size_t)n * C;
      for (int c = 0; c < C; c++) {
        const float grad = (g[c] - xhat[c] * g_xhat_mean) * rstd[n];
        store(di, c, load(di, c) + grad);
      }
    }
  }
}

template <typename T>
void rmsnorm_backward_weight(float* dweight, const T* dout, const T* inp, const float* rstd, int N,
                             int C) {
  const int chunks = (int)ceil_div(C, kChannelChunk);
#pragma omp parallel for schedule(static) if ((size_t)N * C > CPU_PARALLEL_MIN)
  for (int chunk = 0; chunk < chunks; chunk++) {
    const int c0 = chunk * kChannelChunk;
    const int width = std::min(C, c0 + kChannelChunk) - c0;
    double dw[kChannelChunk] = {};
    for (int n = 0; n < N; n++) {
      const T* x = inp + (size_t)n * C + c0;
      const T* d = dout + (size_t)n * C + c0;
      for (int c = 0; c < width; c++) dw[c] += (double)load(d, c) * (load(x, c) * rstd[n]);
    }
    for (int c = 0; c < width; c++) dweight[c0 + c] += (float)dw[c];
  }
}

}  // namespace
}  // namespace cpu

void rmsnorm_forward(void* out, float* rstd, const void* inp, const void* weight, int N, int C,
                     float eps, DType dt, Stream s) {
  OP_SPAN(rmsnorm_forward);
  if (is_dry(s)) return;
  cpu::dispatch_dtype(dt, [&](auto tag) {
    using S = decltype(tag);
    cpu::rmsnorm_forward_typed((S*)out, rstd, (const S*)inp, (const S*)weight, N, C, eps);
  });
}

void rmsnorm_backward(void* dinp, float* dweight, const void* dout, const void* inp,
                      const void* weight, const float* rstd, int N, int C, DType dt, Stream s) {
  OP_SPAN(rmsnorm_backward);
  if (is_dry(s)) return;
  cpu::dispatch_dtype(dt, [&](auto tag) {
    using S = decltype(tag);
    cpu::rmsnorm_backward_inputs((S*)dinp, (const S*)dout, (const S*)inp, (const S*)weight, rstd,
                                 N, C);
    cpu::rmsnorm_backward_weight(dweight, (const S*)dout, (const S*)inp, rstd, N, C);
  });
}

}  // namespace ops
