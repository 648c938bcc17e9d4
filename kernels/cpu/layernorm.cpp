// kernels/cpu/layernorm.cpp - LayerNorm over the last dimension (eps 1e-5), forward and backward.
//
// Forward, rows in parallel: mean and variance in double (two passes over the row), saved as
// fp32 mean and rstd = 1/sqrt(var + eps); out = (x - mean) * rstd * weight + bias in fp32 with
// the saved fp32 statistics, so that the backward sees exactly the normalisation the forward did.
//
// Backward (llm.c's formula), in two passes so that nothing is shared between threads:
//   1. rows in parallel: xhat = (x - mean) * rstd, dnorm = weight * dout,
//      dinp += (dnorm - mean(dnorm) - xhat * mean(dnorm * xhat)) * rstd  (row means in double)
//   2. channel slices in parallel: dweight += sum_n dout * xhat, dbias += sum_n dout, each
//      channel summed over the rows in order in double. Bitwise the same for any thread count.
#include <vector>

#include "kernels/cpu/cpu_common.h"

namespace ops {
namespace cpu {
namespace {

constexpr float kEps = 1e-5f;
constexpr int kChannelChunk = 64;

template <typename T>
void layernorm_forward_typed(T* out, float* mean, float* rstd, const T* inp, const T* weight,
                             const T* bias, int N, int C) {
#pragma omp parallel if ((size_t)N * C > CPU_PARALLEL_MIN)
  {
    std::vector<float> x(C), w(C), b(C);
    load_row(w.data(), weight, C);
    load_row(b.data(), bias, C);
#pragma omp for schedule(static)
    for (int n = 0; n < N; n++) {
      load_row(x.data(), inp + (size_t)n * C, C);
      double sum = 0.0;
      for (int c = 0; c < C; c++) sum += x[c];
      const double mu = sum / C;
      double sq = 0.0;
      for (int c = 0; c < C; c++) sq += (x[c] - mu) * (x[c] - mu);
      const float m = (float)mu;
      const float r = (float)(1.0 / std::sqrt(sq / C + kEps));
      T* o = out + (size_t)n * C;
      for (int c = 0; c < C; c++) store(o, c, (x[c] - m) * r * w[c] + b[c]);
      mean[n] = m;
      rstd[n] = r;
    }
  }
}

template <typename T>
void layernorm_backward_inputs(T* dinp, const T* dout, const T* inp, const T* weight,
                               const float* mean, const float* rstd, int N, int C) {
#pragma omp parallel if ((size_t)N * C > CPU_PARALLEL_MIN)
  {
    std::vector<float> w(C), xhat(C), dnorm(C);
    load_row(w.data(), weight, C);
#pragma omp for schedule(static)
    for (int n = 0; n < N; n++) {
      const T* x = inp + (size_t)n * C;
      const T* d = dout + (size_t)n * C;
      double dnorm_sum = 0.0, dnorm_xhat_sum = 0.0;
      for (int c = 0; c < C; c++) {
        xhat[c] = (load(x, c) - mean[n]) * rstd[n];
        dnorm[c] = w[c] * load(d, c);
        dnorm_sum += dnorm[c];
        dnorm_xhat_sum += (double)dnorm[c] * xhat[c];
      }
      const float dnorm_mean = (float)(dnorm_sum / C);
      const float dnorm_xhat_mean = (float)(dnorm_xhat_sum / C);
      T* di = dinp + (size_t)n * C;
      for (int c = 0; c < C; c++) {
        const float grad = (dnorm[c] - dnorm_mean - xhat[c] * dnorm_xhat_mean) * rstd[n];
        store(di, c, load(di, c) + grad);
      }
    }
  }
}

template <typename T>
void layernorm_backward_params(float* dweight, float* dbias, const T* dout, const T* inp,
                               const float* mean, const float* rstd, int N, int C) {
  const int chunks = (int)ceil_div(C, kChannelChunk);
#pragma omp parallel for schedule(static) if ((size_t)N * C > CPU_PARALLEL_MIN)
  for (int chunk = 0; chunk < chunks; chunk++) {
    const int c0 = chunk * kChannelChunk;
    const int width = std::min(C, c0 + kChannelChunk) - c0;
    double dw[kChannelChunk] = {}, db[kChannelChunk] = {};
    for (int n = 0; n < N; n++) {
      const T* x = inp + (size_t)n * C + c0;
      const T* d = dout + (size_t)n * C + c0;
      for (int c = 0; c < width; c++) {
        const float g = load(d, c);
        const float xhat = (load(x, c) - mean[n]) * rstd[n];
        dw[c] += (double)g * xhat;
        db[c] += g;
      }
    }
    for (int c = 0; c < width; c++) {
      dweight[c0 + c] += (float)dw[c];
      dbias[c0 + c] += (float)db[c];
    }
  }
}

}  // namespace
}  // namespace cpu

void layernorm_forward(void* out, float* mean, float* rstd, const void* inp, const void* weight,
                       const void* bias, int N, int C, DType dt, Stream s) {
  OP_SPAN(layernorm_forward);
  if (is_dry(s)) return;
  cpu::dispatch_dtype(dt, [&](auto tag) {
    using S = decltype(tag);
    cpu::layernorm_forward_typed((S*)out, mean, rstd, (const S*)inp, (const S*)weight,
                                 (const S*)bias, N, C);
  });
}

void layernorm_backward(void* dinp, float* dweight, float* dbias, const void* dout, const void* inp,
                        const void* weight, const float* mean, const float* rstd, int N, int C,
                        DType dt, Stream s) {
  OP_SPAN(layernorm_backward);
  if (is_dry(s)) return;
  cpu::dispatch_dtype(dt, [&](auto tag) {
    using S = decltype(tag);
    cpu::layernorm_backward_inputs((S*)dinp, (const S*)dout, (const S*)inp, (const S*)weight, mean,
                                   rstd, N, C);
    cpu::layernorm_backward_params(dweight, dbias, (const S*)dout, (const S*)inp, mean, rstd, N, C);
  });
}

}  // namespace ops
