// kernels/cpu/attention_rows.h - the attention arithmetic of one (batch, head) that causal
// self-attention (attention.cpp) and ring attention's block (attention_block.cpp) share: the
// head's rows gathered into contiguous fp32 arrays, then a forward and a backward per query row
// against the keys its mask lets it see (KeyRange below).
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
// Which keys a row sees (KeyRange): keys 0..t with a causal mask, all T without one; with
// document ids (packed documents, kernels/ops_decls.h) only the keys of the row's own document,
// which are one contiguous run [lo, hi) because the ids never decrease along a sequence (found
// by binary search; with lo = 0 the arithmetic is exactly the unmasked one). A row that sees no
// key (a ring block of another document) gets out = 0 and lse = -inf, which the merge ignores.
//
// Grouped-query attention: NH query heads share NKV kv heads, query head h using kv head
// h / (NH/NKV). The forward is one task per (batch, query head) that gathers its kv head; the
// backward one task per (batch, kv head) that gathers k, v once and walks the group's query
// heads in order, summing their dk, dv in the same arrays (no races, no atomics, and with
// NKV = NH exactly the multi-head arithmetic).
#pragma once
#include <omp.h>

#include <algorithm>
#include <cmath>

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

// s[j] = scale * (q . k_j) for j < n (kt: the first key's column). Forward and backward share
// it, so they see the same s.
inline void row_scores(float* s, const float* q, const float* kt, int T, int n, int HS,
                       float scale) {
  for (int j = 0; j < n; j++) s[j] = 0.0f;
  accumulate_rows(s, q, kt, T, HS, n);
  for (int j = 0; j < n; j++) s[j] *= scale;
}

// The keys [lo, hi) a query row sees.
struct KeyRange {
  int lo, hi;
  int n() const { return hi - lo; }
};

// The mask of one (query block, key block) of T rows each: causal (key j <= query i) or not,
// and with document ids (q_docs, k_docs, T each; null: none) only keys of the query's document.
struct RowMask {
  bool causal;
  const int* q_docs = nullptr;
  const int* k_docs = nullptr;
  KeyRange keys(int t, int T) const {
    KeyRange r{0, causal ? t + 1 : T};
    if (q_docs) {
      const int doc = q_docs[t];
      r.lo = (int)(std::lower_bound(k_docs, k_docs + T, doc) - k_docs);
      r.hi = std::min(r.hi, (int)(std::upper_bound(k_docs, k_docs + T, doc) - k_docs));
      r.hi = std::max(r.hi, r.lo);
    }
    return r;
  }
};

// Query row t against keys [k.lo, k.hi) (n >= 1): writes a.out's row t, returns the row's lse.
// Reads a.q, a.kt, a.v.
inline float forward_row(HeadArrays& a, int t, KeyRange k, int T, int HS, float scale) {
  float* s = a.scores;
  float* o = a.out + (size_t)t * HS;
  for (int d = 0; d < HS; d++) o[d] = 0.0f;
  const int n = k.n();
  if (n <= 0) return -INFINITY;  // no key of this row's document in the block
  row_scores(s, a.q + (size_t)t * HS, a.kt + k.lo, T, n, HS, scale);
  const float max = max_span(s, n);
  exp_shifted(s, s, max, n);
  const double sum = sum_span(s, n);
  accumulate_rows(o, s, a.v + (size_t)k.lo * HS, HS, n, HS);
  const float inv_sum = (float)(1.0 / sum);
  for (int d = 0; d < HS; d++) o[d] *= inv_sum;
  return max + (float)std::log(sum);
}

// Query row t against keys [k.lo, k.hi), given its lse: writes a.dq's row t and adds to a.dk,
// a.dv (rows lo..hi-1). Reads a.q, a.k, a.kt, a.vt, a.out, a.dout.
inline void backward_row(HeadArrays& a, int t, KeyRange k, float lse, int T, int HS,
                         float scale) {
  const float* q = a.q + (size_t)t * HS;
  const float* dout_t = a.dout + (size_t)t * HS;
  float* p = a.scores;
  float* dp = a.dscores;
  float* ds = a.dscores;  // ds[j] overwrites dp[j] once dp[j] is used
  float* dq = a.dq + (size_t)t * HS;
  for (int d = 0; d < HS; d++) dq[d] = 0.0f;
  const int n = k.n(), lo = k.lo;
  if (n <= 0) return;
  row_scores(p, q, a.kt + lo, T, n, HS, scale);
  exp_shifted(p, p, lse, n);
  for (int j = 0; j < n; j++) dp[j] = 0.0f;
  accumulate_rows(dp, dout_t, a.vt + lo, T, HS, n);
  double D = 0.0;
  for (int d = 0; d < HS; d++) D += (double)dout_t[d] * a.out[(size_t)t * HS + d];
  for (int j = 0; j < n; j++) ds[j] = p[j] * (dp[j] - (float)D) * scale;
  accumulate_rows(dq, ds, a.k + (size_t)lo * HS, HS, n, HS);
  add_outer(a.dk + (size_t)lo * HS, ds, q, n, HS);
  add_outer(a.dv + (size_t)lo * HS, p, dout_t, n, HS);
}

// Every query row of the head: a.out and lse[t] (t < T), each row against the keys `mask` lets
// it see.
inline void forward_rows(HeadArrays& a, float* lse, int T, int HS, const RowMask& mask) {
  const float scale = 1.0f / std::sqrt((float)HS);
  for (int t = 0; t < T; t++) lse[t] = forward_row(a, t, mask.keys(t, T), T, HS, scale);
}

// Zeroes a.dk and a.dv, which backward_rows then sums into (over a kv head's query heads).
inline void clear_kv_grads(HeadArrays& a, int T, int HS) {
  std::fill(a.dk, a.dk + (size_t)T * HS, 0.0f);
  std::fill(a.dv, a.dv + (size_t)T * HS, 0.0f);
}

// Every query row of the head: a.dq written, the rows' shares added to a.dk and a.dv.
inline void backward_rows(HeadArrays& a, const float* lse, int T, int HS, const RowMask& mask) {
  const float scale = 1.0f / std::sqrt((float)HS);
  for (int t = 0; t < T; t++) backward_row(a, t, mask.keys(t, T), lse[t], T, HS, scale);
}

}  // namespace cpu
}  // namespace ops
