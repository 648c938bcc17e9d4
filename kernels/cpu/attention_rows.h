// kernels/cpu/attention_rows.h - the attention arithmetic of one (batch, head) that causal
// self-attention (attention.cpp) and ring attention's block (attention_block.cpp) share: the
// head's rows gathered into contiguous fp32 arrays, then a forward and a backward per query row
// against the first n keys (n = t + 1 for a causal mask, n = T for a full block).
//
// The layout trick: q, k, v (and in the backward out, dout) are copied into contiguous fp32
// arrays, k and v also transposed, so that every inner loop is a vectorised axpy over contiguous
// memory with a fixed summation order (vector_math.h):
//   scores  s[j]  = sum_d q[t,d] * kT[d,j]       (accumulate_rows: axpys over j, d in order)
//   output  o[:]  = sum_j p[j] * v[j,:]           (accumulate_rows: axpys over d, j in order)
//   dk[j,:] += ds[j] * q[t,:]                      (add_outer)
// Only one row of scores (T floats) exists at a time; no (T,T) matrix is stored. The per-thread
// arrays live in the stream's scratch (cpu_common.h), so repeated calls allocate nothing.
//
// Forward, per query row t: s = q.k / sqrt(HS) for j < n, m = max s, p = exp(s - m),
// l = sum p (double; vector_math.h's vectorised loops), out = (sum p v) / l, lse = m + log l.
// Backward, per row, with p = exp(s - lse) recomputed from the given lse (for a ring block: the
// final lse over every block, so p is this block's share of the full softmax):
//   dp[j] = dout[t] . v[j],  D = dout[t] . out[t]  (the stored output, as flash attention does)
//   ds[j] = p[j] (dp[j] - D) / sqrt(HS);  dq[t] = sum_j ds[j] k[j];  dk[j] += ds[j] q[t];
//   dv[j] += p[j] dout[t].   dk and dv are summed in fp32 over t in the head's arrays.
// Every (batch, head) is one sequential task, so results are bitwise the same for any thread
// count.
//
// Grouped-query attention: NH query heads share NKV kv heads, query head h using kv head
// h / (NH/NKV). The forward is one task per (batch, query head) that gathers its kv head; the
// backward one task per (batch, kv head) that gathers k, v once and walks the group's query
// heads in order, summing their dk, dv in the same arrays (no races, no atomics, and with
// NKV = NH exactly the multi-head arithmetic).
#pragma once
#include <omp.h>

#include "kernels/cpu/vector_math.h"

namespace ops {
namespace cpu {

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

// Column offsets inside the packed qkv rows [q heads | k heads | v heads] (ops_decls.h).
struct QkvColumns {
  int NH, NKV, HS;
  size_t width() const { return (size_t)(NH + 2 * NKV) * HS; }
  int group() const { return NH / NKV; }  // query heads per kv head
  int q(int h) const { return h * HS; }
  int k(int g) const { return (NH + g) * HS; }
  int v(int g) const { return (NH + NKV + g) * HS; }
};

// The columns of a call's shape, checked: NKV must divide NH.
inline QkvColumns qkv_columns(int NH, int NKV, int HS, const char* op) {
  CHECK(NH > 0 && NKV > 0 && HS > 0 && NH % NKV == 0,
        "%s: %d kv heads do not divide %d query heads (head size %d)", op, NKV, NH, HS);
  return QkvColumns{NH, NKV, HS};
}

// Calls fn(b, h, arrays) for every (batch, head) of `heads` heads (query or kv heads), in
// parallel, each thread with HeadArrays of
// its own in the stream's scratch.
template <typename Fn>
inline void for_each_head(int B, int heads, int T, int HS, Stream s, Fn&& fn) {
  const size_t per_thread = HeadArrays::floats(T, HS);
  Scratch scratch(s, per_thread * omp_get_max_threads());
#pragma omp parallel if ((size_t)B * heads * T * T * HS > CPU_PARALLEL_MIN)
  {
    HeadArrays arrays(scratch.data() + per_thread * omp_get_thread_num(), T, HS);
#pragma omp for schedule(static)
    for (int task = 0; task < B * heads; task++) fn(task / heads, task % heads, arrays);
  }
}

// Copies columns [col0, col0 + HS) of the (T, row_width) rows of one sequence into dst (T, HS),
// and into dst_t (HS, T) when given.
template <typename Elem>
inline void gather_head(float* dst, float* dst_t, const Elem* rows, size_t row_width, int col0,
                        int T, int HS) {
  for (int t = 0; t < T; t++) {
    const Elem* src = rows + (size_t)t * row_width + col0;
    for (int d = 0; d < HS; d++) {
      const float x = load(src, d);
      dst[(size_t)t * HS + d] = x;
      if (dst_t) dst_t[(size_t)d * T + t] = x;
    }
  }
}

// The reverse: src (T, HS) into columns [col0, col0 + HS) of the rows, stored (rounded) as Elem.
template <typename Elem>
inline void scatter_head(Elem* rows, size_t row_width, int col0, const float* src, int T, int HS) {
  for (int t = 0; t < T; t++)
    store_row(rows + (size_t)t * row_width + col0, src + (size_t)t * HS, HS);
}

// The same, accumulated: rows (fp32) += src.
inline void add_head(float* rows, size_t row_width, int col0, const float* src, int T, int HS) {
  for (int t = 0; t < T; t++) {
    float* dst = rows + (size_t)t * row_width + col0;
    for (int d = 0; d < HS; d++) dst[d] += src[(size_t)t * HS + d];
  }
}

// s[j] = scale * (q . k_j) for j < n. Forward and backward share it, so they see the same s.
inline void row_scores(float* s, const float* q, const float* kt, int T, int n, int HS,
                       float scale) {
  for (int j = 0; j < n; j++) s[j] = 0.0f;
  accumulate_rows(s, q, kt, T, HS, n);
  for (int j = 0; j < n; j++) s[j] *= scale;
}

// Query row t against keys 0..n-1 (n >= 1): writes a.out's row t, returns the row's lse.
// Reads a.q, a.kt, a.v.
inline float forward_row(HeadArrays& a, int t, int n, int T, int HS, float scale) {
  float* s = a.scores;
  row_scores(s, a.q + (size_t)t * HS, a.kt, T, n, HS, scale);
  const float max = max_span(s, n);
  exp_shifted(s, s, max, n);
  const double sum = sum_span(s, n);
  float* o = a.out + (size_t)t * HS;
  for (int d = 0; d < HS; d++) o[d] = 0.0f;
  accumulate_rows(o, s, a.v, HS, n, HS);
  const float inv_sum = (float)(1.0 / sum);
  for (int d = 0; d < HS; d++) o[d] *= inv_sum;
  return max + (float)std::log(sum);
}

// Query row t against keys 0..n-1, given its lse: writes a.dq's row t and adds to a.dk, a.dv
// (rows 0..n-1). Reads a.q, a.k, a.kt, a.vt, a.out, a.dout.
inline void backward_row(HeadArrays& a, int t, int n, float lse, int T, int HS, float scale) {
  const float* q = a.q + (size_t)t * HS;
  const float* dout_t = a.dout + (size_t)t * HS;
  float* p = a.scores;
  float* dp = a.dscores;
  float* ds = a.dscores;  // ds[j] overwrites dp[j] once dp[j] is used
  row_scores(p, q, a.kt, T, n, HS, scale);
  exp_shifted(p, p, lse, n);
  for (int j = 0; j < n; j++) dp[j] = 0.0f;
  accumulate_rows(dp, dout_t, a.vt, T, HS, n);
  double D = 0.0;
  for (int d = 0; d < HS; d++) D += (double)dout_t[d] * a.out[(size_t)t * HS + d];
  float* dq = a.dq + (size_t)t * HS;
  for (int d = 0; d < HS; d++) dq[d] = 0.0f;
  for (int j = 0; j < n; j++) ds[j] = p[j] * (dp[j] - (float)D) * scale;
  accumulate_rows(dq, ds, a.k, HS, n, HS);
  add_outer(a.dk, ds, q, n, HS);
  add_outer(a.dv, p, dout_t, n, HS);
}

// Every query row of the head: a.out and lse[t] (t < T). causal: row t sees keys 0..t, else all.
inline void forward_rows(HeadArrays& a, float* lse, int T, int HS, bool causal) {
  const float scale = 1.0f / std::sqrt((float)HS);
  for (int t = 0; t < T; t++) lse[t] = forward_row(a, t, causal ? t + 1 : T, T, HS, scale);
}

// Zeroes a.dk and a.dv, which backward_rows then sums into (over a kv head's query heads).
inline void clear_kv_grads(HeadArrays& a, int T, int HS) {
  std::fill(a.dk, a.dk + (size_t)T * HS, 0.0f);
  std::fill(a.dv, a.dv + (size_t)T * HS, 0.0f);
}

// Every query row of the head: a.dq written, the rows' shares added to a.dk and a.dv.
inline void backward_rows(HeadArrays& a, const float* lse, int T, int HS, bool causal) {
  const float scale = 1.0f / std::sqrt((float)HS);
  for (int t = 0; t < T; t++) backward_row(a, t, causal ? t + 1 : T, lse[t], T, HS, scale);
}

}  // namespace cpu
}  // namespace ops
