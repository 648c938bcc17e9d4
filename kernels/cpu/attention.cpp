// kernels/cpu/attention.cpp - causal multi-head self-attention over packed qkv (B,T,3C), forward
// (output and per-row log-sum-exp) and backward (recomputing the probabilities from the lse).
//
// Parallelism: one task per (batch, head), in parallel; a task is sequential, so results are
// bitwise the same for any thread count. A task first copies its head's q, k, v (and in the
// backward out, dout) into contiguous fp32 arrays, k and v also transposed, so that every inner
// loop is a vectorised axpy over contiguous memory with a fixed summation order:
//   scores  s[j]  = sum_d q[t,d] * kT[d,j]       (axpy over j, for d in order)
//   output  o[:]  = sum_j p[j] * v[j,:]           (axpy over d, for j in order)
// Only one row of scores (T floats) exists at a time; no (T,T) matrix is stored.
//
// Forward, per query row t: s = q.k / sqrt(HS) for j <= t, m = max s, p = exp(s - m),
// l = sum p (double), out = (sum p v) / l, lse = m + log l.
// Backward, per row, with p = exp(s - lse) recomputed from the saved lse:
//   dp[j] = dout[t] . v[j],  D = dout[t] . out[t]  (the stored output, as flash attention does:
//   with a global lse and out this also serves one block of ring attention)
//   ds[j] = p[j] (dp[j] - D) / sqrt(HS);  dq[t] = sum_j ds[j] k[j];  dk[j] += ds[j] q[t];
//   dv[j] += p[j] dout[t].   dk and dv are summed in fp32 over t and stored once at the end.
#include <vector>

#include "kernels/cpu/gemm.h"

namespace ops {
namespace cpu {
namespace {

// One head's rows, fp32, contiguous: row-major (T, HS) and transposed (HS, T) as needed.
struct HeadArrays {
  std::vector<float> q, k, kt, v, vt, out, dout, dq, dk, dv, scores, dscores;
  void resize(int T, int HS, bool backward) {
    const size_t n = (size_t)T * HS;
    for (auto* a : {&q, &k, &kt, &v, &out}) a->resize(n);
    scores.resize(T);
    if (!backward) return;
    for (auto* a : {&vt, &dout, &dq, &dk, &dv}) a->resize(n);
    dscores.resize(T);
  }
};

// Copies columns [col0, col0 + HS) of the (T, row_width) rows of one sequence into dst (T, HS),
// and into dst_t (HS, T) when given.
template <typename T>
void gather_head(float* dst, float* dst_t, const T* rows, size_t row_width, int col0, int T_,
                 int HS) {
  for (int t = 0; t < T_; t++) {
    const T* src = rows + (size_t)t * row_width + col0;
    for (int d = 0; d < HS; d++) {
      const float x = load(src, d);
      dst[(size_t)t * HS + d] = x;
      if (dst_t) dst_t[(size_t)d * T_ + t] = x;
    }
  }
}

template <typename T>
void scatter_head(T* rows, size_t row_width, int col0, const float* src, int T_, int HS) {
  for (int t = 0; t < T_; t++) store_row(rows + (size_t)t * row_width + col0, src + (size_t)t * HS, HS);
}

// s[j] = scale * (q . k_j) for j <= t. Forward and backward share it, so they see the same s.
void causal_scores(float* s, const float* q, const float* kt, int T_, int t, int HS, float scale) {
  for (int j = 0; j <= t; j++) s[j] = 0.0f;
  for (int d = 0; d < HS; d++) axpy(s, kt + (size_t)d * T_, q[d], t + 1);
  for (int j = 0; j <= t; j++) s[j] *= scale;
}

template <typename T>
void attention_forward_head(T* out, float* lse, const T* qkv, int b, int h, int T_, int NH, int HS,
                            HeadArrays& a) {
  const int C = NH * HS;
  const float scale = 1.0f / std::sqrt((float)HS);
  const T* rows = qkv + (size_t)b * T_ * 3 * C;
  gather_head(a.q.data(), nullptr, rows, 3 * C, h * HS, T_, HS);
  gather_head(a.k.data(), a.kt.data(), rows, 3 * C, C + h * HS, T_, HS);
  gather_head(a.v.data(), nullptr, rows, 3 * C, 2 * C + h * HS, T_, HS);
  float* s = a.scores.data();
  for (int t = 0; t < T_; t++) {
    causal_scores(s, a.q.data() + (size_t)t * HS, a.kt.data(), T_, t, HS, scale);
    float max = s[0];
    for (int j = 1; j <= t; j++) max = std::max(max, s[j]);
    double sum = 0.0;
    for (int j = 0; j <= t; j++) {
      s[j] = expf(s[j] - max);
      sum += s[j];
    }
    float* o = a.out.data() + (size_t)t * HS;
    for (int d = 0; d < HS; d++) o[d] = 0.0f;
    for (int j = 0; j <= t; j++) axpy(o, a.v.data() + (size_t)j * HS, s[j], HS);
    const float inv_sum = (float)(1.0 / sum);
    for (int d = 0; d < HS; d++) o[d] *= inv_sum;
    lse[((size_t)b * NH + h) * T_ + t] = max + (float)std::log(sum);
  }
  scatter_head(out + (size_t)b * T_ * C, C, h * HS, a.out.data(), T_, HS);
}

template <typename T>
void attention_backward_head(T* dqkv, const T* dout, const T* qkv, const T* out, const float* lse,
                             int b, int h, int T_, int NH, int HS, HeadArrays& a) {
  const int C = NH * HS;
  const float scale = 1.0f / std::sqrt((float)HS);
  const T* rows = qkv + (size_t)b * T_ * 3 * C;
  gather_head(a.q.data(), nullptr, rows, 3 * C, h * HS, T_, HS);
  gather_head(a.k.data(), a.kt.data(), rows, 3 * C, C + h * HS, T_, HS);
  gather_head(a.v.data(), a.vt.data(), rows, 3 * C, 2 * C + h * HS, T_, HS);
  gather_head(a.out.data(), nullptr, out + (size_t)b * T_ * C, C, h * HS, T_, HS);
  gather_head(a.dout.data(), nullptr, dout + (size_t)b * T_ * C, C, h * HS, T_, HS);
  std::fill(a.dk.begin(), a.dk.end(), 0.0f);
  std::fill(a.dv.begin(), a.dv.end(), 0.0f);
  const float* row_lse = lse + ((size_t)b * NH + h) * T_;
  float* p = a.scores.data();
  float* dp = a.dscores.data();
  for (int t = 0; t < T_; t++) {
    const float* q = a.q.data() + (size_t)t * HS;
    const float* dout_t = a.dout.data() + (size_t)t * HS;
    causal_scores(p, q, a.kt.data(), T_, t, HS, scale);
    for (int j = 0; j <= t; j++) p[j] = expf(p[j] - row_lse[t]);
    for (int j = 0; j <= t; j++) dp[j] = 0.0f;
    for (int d = 0; d < HS; d++) axpy(dp, a.vt.data() + (size_t)d * T_, dout_t[d], t + 1);
    double D = 0.0;
    for (int d = 0; d < HS; d++) D += (double)dout_t[d] * a.out[(size_t)t * HS + d];
    float* dq = a.dq.data() + (size_t)t * HS;
    for (int d = 0; d < HS; d++) dq[d] = 0.0f;
    for (int j = 0; j <= t; j++) {
      const float ds = p[j] * (dp[j] - (float)D) * scale;
      axpy(dq, a.k.data() + (size_t)j * HS, ds, HS);
      axpy(a.dk.data() + (size_t)j * HS, q, ds, HS);
      axpy(a.dv.data() + (size_t)j * HS, dout_t, p[j], HS);
    }
  }
  T* drows = dqkv + (size_t)b * T_ * 3 * C;
  scatter_head(drows, 3 * C, h * HS, a.dq.data(), T_, HS);
  scatter_head(drows, 3 * C, C + h * HS, a.dk.data(), T_, HS);
  scatter_head(drows, 3 * C, 2 * C + h * HS, a.dv.data(), T_, HS);
}

}  // namespace
}  // namespace cpu

void attention_forward(void* out, float* lse, const void* qkv, int B, int T, int NH, int HS,
                       DType dt, Stream s) {
  cpu::dispatch_dtype(dt, [&](auto tag) {
    using S = decltype(tag);
#pragma omp parallel if ((size_t)B * NH * T * T * HS > CPU_PARALLEL_MIN)
    {
      cpu::HeadArrays arrays;
      arrays.resize(T, HS, false);
#pragma omp for schedule(static)
      for (int task = 0; task < B * NH; task++)
        cpu::attention_forward_head((S*)out, lse, (const S*)qkv, task / NH, task % NH, T, NH, HS,
                                    arrays);
    }
  });
}

void attention_backward(void* dqkv, const void* dout, const void* qkv, const void* out,
                        const float* lse, int B, int T, int NH, int HS, DType dt, Stream s) {
  cpu::dispatch_dtype(dt, [&](auto tag) {
    using S = decltype(tag);
#pragma omp parallel if ((size_t)B * NH * T * T * HS > CPU_PARALLEL_MIN)
    {
      cpu::HeadArrays arrays;
      arrays.resize(T, HS, true);
#pragma omp for schedule(static)
      for (int task = 0; task < B * NH; task++)
        cpu::attention_backward_head((S*)dqkv, (const S*)dout, (const S*)qkv, (const S*)out, lse,
                                     task / NH, task % NH, T, NH, HS, arrays);
    }
  });
}

}  // namespace ops
