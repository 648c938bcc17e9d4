// kernels/cpu/attention.cpp - causal multi-head self-attention over packed qkv (B,T,3C), forward
// (output and per-row log-sum-exp) and backward (recomputing the probabilities from the lse).
//
// Parallelism: one task per (batch, head), in parallel; a task is sequential, so results are
// bitwise the same for any thread count. A task first copies its head's q, k, v (and in the
// backward out, dout) into contiguous fp32 arrays, k and v also transposed, so that every inner
// loop is a vectorised axpy over contiguous memory with a fixed summation order (vector_math.h):
//   scores  s[j]  = sum_d q[t,d] * kT[d,j]       (accumulate_rows: axpys over j, d in order)
//   output  o[:]  = sum_j p[j] * v[j,:]           (accumulate_rows: axpys over d, j in order)
//   dk[j,:] += ds[j] * q[t,:]                      (add_outer)
// Only one row of scores (T floats) exists at a time; no (T,T) matrix is stored. The per-thread
// arrays live in the stream's scratch (cpu_common.h), so repeated calls allocate nothing.
//
// Forward, per query row t: s = q.k / sqrt(HS) for j <= t, m = max s, p = exp(s - m),
// l = sum p (double; vector_math.h's vectorised loops), out = (sum p v) / l, lse = m + log l.
// Backward, per row, with p = exp(s - lse) recomputed from the saved lse:
//   dp[j] = dout[t] . v[j],  D = dout[t] . out[t]  (the stored output, as flash attention does:
//   with a global lse and out this also serves one block of ring attention)
//   ds[j] = p[j] (dp[j] - D) / sqrt(HS);  dq[t] = sum_j ds[j] k[j];  dk[j] += ds[j] q[t];
//   dv[j] += p[j] dout[t].   dk and dv are summed in fp32 over t and stored once at the end.
#include <omp.h>

#include "kernels/cpu/vector_math.h"

namespace ops {
namespace cpu {
namespace {

// One head's rows, fp32, contiguous: row-major (T, HS) and transposed (HS, T), carved out of a
// thread's share of the stream's scratch.
struct HeadArrays {
  float *q, *k, *kt, *v, *vt, *out, *dout, *dq, *dk, *dv, *scores, *dscores;
  static size_t floats(int T, int HS) { return 10 * (size_t)T * HS + 2 * (size_t)T; }
  HeadArrays(float* base, int T, int HS) {
    const size_t n = (size_t)T * HS;
    for (float** a : {&q, &k, &kt, &v, &vt, &out, &dout, &dq, &dk, &dv}) {
      *a = base;
      base += n;
    }
    scores = base;
    dscores = base + T;
  }
};

// Copies columns [col0, col0 + HS) of the (T, row_width) rows of one sequence into dst (T, HS),
// and into dst_t (HS, T) when given.
template <typename Elem>
void gather_head(float* dst, float* dst_t, const Elem* rows, size_t row_width, int col0, int T,
                 int HS) {
  for (int t = 0; t < T; t++) {
    const Elem* src = rows + (size_t)t * row_width + col0;
    for (int d = 0; d < HS; d++) {
      const float x = load(src, d);
      dst[(size_t)t * HS + d] = x;
      if (dst_t) dst_t[(size_t)d * T + t] = x;
    }
  }
}

template <typename Elem>
void scatter_head(Elem* rows, size_t row_width, int col0, const float* src, int T, int HS) {
  for (int t = 0; t < T; t++)
    store_row(rows + (size_t)t * row_width + col0, src + (size_t)t * HS, HS);
}

// s[j] = scale * (q . k_j) for j <= t. Forward and backward share it, so they see the same s.
void causal_scores(float* s, const float* q, const float* kt, int T, int t, int HS, float scale) {
  for (int j = 0; j <= t; j++) s[j] = 0.0f;
  accumulate_rows(s, q, kt, T, HS, t + 1);
  for (int j = 0; j <= t; j++) s[j] *= scale;
}

template <typename Elem>
void attention_forward_head(Elem* out, float* lse, const Elem* qkv, int b, int h, int T, int NH,
                            int HS, HeadArrays& a) {
  const int C = NH * HS;
  const float scale = 1.0f / std::sqrt((float)HS);
  const Elem* rows = qkv + (size_t)b * T * 3 * C;
  gather_head(a.q, nullptr, rows, 3 * C, h * HS, T, HS);
  gather_head(a.k, a.kt, rows, 3 * C, C + h * HS, T, HS);
  gather_head(a.v, nullptr, rows, 3 * C, 2 * C + h * HS, T, HS);
  float* s = a.scores;
  for (int t = 0; t < T; t++) {
    causal_scores(s, a.q + (size_t)t * HS, a.kt, T, t, HS, scale);
    const float max = max_span(s, t + 1);
    exp_shifted(s, s, max, t + 1);
    const double sum = sum_span(s, t + 1);
    float* o = a.out + (size_t)t * HS;
    for (int d = 0; d < HS; d++) o[d] = 0.0f;
    accumulate_rows(o, s, a.v, HS, t + 1, HS);
    const float inv_sum = (float)(1.0 / sum);
    for (int d = 0; d < HS; d++) o[d] *= inv_sum;
    lse[((size_t)b * NH + h) * T + t] = max + (float)std::log(sum);
  }
  scatter_head(out + (size_t)b * T * C, C, h * HS, a.out, T, HS);
}

template <typename Elem>
void attention_backward_head(Elem* dqkv, const Elem* dout, const Elem* qkv, const Elem* out,
                             const float* lse, int b, int h, int T, int NH, int HS, HeadArrays& a) {
  const int C = NH * HS;
  const float scale = 1.0f / std::sqrt((float)HS);
  const Elem* rows = qkv + (size_t)b * T * 3 * C;
  gather_head(a.q, nullptr, rows, 3 * C, h * HS, T, HS);
  gather_head(a.k, a.kt, rows, 3 * C, C + h * HS, T, HS);
  gather_head(a.v, a.vt, rows, 3 * C, 2 * C + h * HS, T, HS);
  gather_head(a.out, nullptr, out + (size_t)b * T * C, C, h * HS, T, HS);
  gather_head(a.dout, nullptr, dout + (size_t)b * T * C, C, h * HS, T, HS);
  std::fill(a.dk, a.dk + (size_t)T * HS, 0.0f);
  std::fill(a.dv, a.dv + (size_t)T * HS, 0.0f);
  const float* row_lse = lse + ((size_t)b * NH + h) * T;
  float* p = a.scores;
  float* dp = a.dscores;
  float* ds = a.dscores;  // ds[j] overwrites dp[j] once dp[j] is used
  for (int t = 0; t < T; t++) {
    const float* q = a.q + (size_t)t * HS;
    const float* dout_t = a.dout + (size_t)t * HS;
    causal_scores(p, q, a.kt, T, t, HS, scale);
    exp_shifted(p, p, row_lse[t], t + 1);
    for (int j = 0; j <= t; j++) dp[j] = 0.0f;
    accumulate_rows(dp, dout_t, a.vt, T, HS, t + 1);
    double D = 0.0;
    for (int d = 0; d < HS; d++) D += (double)dout_t[d] * a.out[(size_t)t * HS + d];
    float* dq = a.dq + (size_t)t * HS;
    for (int d = 0; d < HS; d++) dq[d] = 0.0f;
    for (int j = 0; j <= t; j++) ds[j] = p[j] * (dp[j] - (float)D) * scale;
    accumulate_rows(dq, ds, a.k, HS, t + 1, HS);
    add_outer(a.dk, ds, q, t + 1, HS);
    add_outer(a.dv, p, dout_t, t + 1, HS);
  }
  Elem* drows = dqkv + (size_t)b * T * 3 * C;
  scatter_head(drows, 3 * C, h * HS, a.dq, T, HS);
  scatter_head(drows, 3 * C, C + h * HS, a.dk, T, HS);
  scatter_head(drows, 3 * C, 2 * C + h * HS, a.dv, T, HS);
}

}  // namespace
}  // namespace cpu

void attention_forward(void* out, float* lse, const void* qkv, int B, int T, int NH, int HS,
                       DType dt, Stream s) {
  const size_t per_thread = cpu::HeadArrays::floats(T, HS);
  cpu::Scratch scratch(s, per_thread * omp_get_max_threads());
  cpu::dispatch_dtype(dt, [&](auto tag) {
    using S = decltype(tag);
#pragma omp parallel if ((size_t)B * NH * T * T * HS > CPU_PARALLEL_MIN)
    {
      cpu::HeadArrays arrays(scratch.data() + per_thread * omp_get_thread_num(), T, HS);
#pragma omp for schedule(static)
      for (int task = 0; task < B * NH; task++)
        cpu::attention_forward_head((S*)out, lse, (const S*)qkv, task / NH, task % NH, T, NH, HS,
                                    arrays);
    }
  });
}

void attention_backward(void* dqkv, const void* dout, const void* qkv, const void* out,
                        const float* lse, int B, int T, int NH, int HS, DType dt, Stream s) {
  const size_t per_thread = cpu::HeadArrays::floats(T, HS);
  cpu::Scratch scratch(s, per_thread * omp_get_max_threads());
  cpu::dispatch_dtype(dt, [&](auto tag) {
    using S = decltype(tag);
#pragma omp parallel if ((size_t)B * NH * T * T * HS > CPU_PARALLEL_MIN)
    {
      cpu::HeadArrays arrays(scratch.data() + per_thread * omp_get_thread_num(), T, HS);
#pragma omp for schedule(static)
      for (int task = 0; task < B * NH; task++)
        cpu::attention_backward_head((S*)dqkv, (const S*)dout, (const S*)qkv, (const S*)out, lse,
                                     task / NH, task % NH, T, NH, HS, arrays);
    }
  });
}

}  // namespace ops
