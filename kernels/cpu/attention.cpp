// kernels/cpu/attention.cpp - causal grouped-query self-attention over packed qkv
// (B,T,(NH+2NKV)HS) = [q heads | k heads | v heads], forward (output and per-row log-sum-exp) and
// backward (recomputing the probabilities from the lse). Query head h uses kv head h / (NH/NKV);
// NKV = NH is multi-head attention (GPT-2).
//
// Parallelism: the forward is one task per (batch, query head), the backward one task per
// (batch, kv head) that walks the kv head's query heads in order and sums their dk, dv in one
// array (attention_rows.h); tasks run in parallel, each sequential, so results are bitwise the
// same for any thread count. A task gathers its head's q, k, v (and in the backward out, dout)
// out of the packed rows into contiguous fp32 arrays and runs the per-row arithmetic of
// attention_rows.h with a causal mask (row t sees keys 0..t; with document ids, packed documents,
// only those of its own document: a block-causal mask): vectorised axpys in a fixed order,
// one row of scores at a time, no (T,T) matrix. Ring attention's block (attention_block.cpp)
// runs the same rows on its own gathers.
//
// Forward, per query row t: s = q.k / sqrt(HS) for j <= t, m = max s, p = exp(s - m),
// l = sum p (double), out = (sum p v) / l, lse = m + log l.
// Backward, per row, with p = exp(s - lse) recomputed from the saved lse and D = dout[t] . out[t]:
//   ds[j] = p[j] (dout[t] . v[j] - D) / sqrt(HS);  dq[t] = sum_j ds[j] k[j];  dk[j] += ds[j] q[t];
//   dv[j] += p[j] dout[t].   dk and dv are summed in fp32 over t (and over the group's query
//   heads) and stored once at the end.
#include "kernels/cpu/attention_rows.h"

namespace ops {
namespace cpu {
namespace {

template <typename Elem>
void attention_forward_head(Elem* out, float* lse, const Elem* qkv, const int* docs, int b,
                            int h, int T, const QkvColumns& cols, HeadArrays& a) {
  const int HS = cols.HS, C = cols.NH * HS, g = h / cols.group();
  const Elem* rows = qkv + (size_t)b * T * cols.width();
  gather_head(a.q, nullptr, rows, cols.width(), cols.q(h), T, HS);
  gather_head(a.k, a.kt, rows, cols.width(), cols.k(g), T, HS);
  gather_head(a.v, nullptr, rows, cols.width(), cols.v(g), T, HS);
  const int* row_docs = docs ? docs + (size_t)b * T : nullptr;
  forward_rows(a, lse + ((size_t)b * cols.NH + h) * T, T, HS, RowMask{true, row_docs, row_docs});
  scatter_head(out + (size_t)b * T * C, C, h * HS, a.out, T, HS);
}

// kv head g of sequence b: dq of each of its query heads, then dk, dv summed over them.
template <typename Elem>
void attention_backward_kv_head(Elem* dqkv, const Elem* dout, const Elem* qkv, const Elem* out,
                                const float* lse, const int* docs, int b, int g, int T,
                                const QkvColumns& cols, HeadArrays& a) {
  const int HS = cols.HS, C = cols.NH * HS;
  const Elem* rows = qkv + (size_t)b * T * cols.width();
  Elem* drows = dqkv + (size_t)b * T * cols.width();
  gather_head(a.k, a.kt, rows, cols.width(), cols.k(g), T, HS);
  gather_head(a.v, a.vt, rows, cols.width(), cols.v(g), T, HS);
  clear_kv_grads(a, T, HS);
  const int* row_docs = docs ? docs + (size_t)b * T : nullptr;
  const RowMask mask{true, row_docs, row_docs};
  for (int h = g * cols.group(); h < (g + 1) * cols.group(); h++) {
    gather_head(a.q, nullptr, rows, cols.width(), cols.q(h), T, HS);
    gather_head(a.out, nullptr, out + (size_t)b * T * C, C, h * HS, T, HS);
    gather_head(a.dout, nullptr, dout + (size_t)b * T * C, C, h * HS, T, HS);
    backward_rows(a, lse + ((size_t)b * cols.NH + h) * T, T, HS, mask);
    scatter_head(drows, cols.width(), cols.q(h), a.dq, T, HS);
  }
  scatter_head(drows, cols.width(), cols.k(g), a.dk, T, HS);
  scatter_head(drows, cols.width(), cols.v(g), a.dv, T, HS);
}

}  // namespace
}  // namespace cpu

void attention_forward(void* out, float* lse, const void* qkv, int B, int T, int NH, int NKV,
                       int HS, DType dt, Stream s, const int* docs) {
  OP_SPAN(attention_forward);
  if (is_dry(s)) return;
  const cpu::QkvColumns cols = cpu::qkv_columns(NH, NKV, HS, "attention");
  cpu::dispatch_dtype(dt, [&](auto tag) {
    using S = decltype(tag);
    cpu::for_each_head(B, NH, T, HS, s, [&](int b, int h, cpu::HeadArrays& arrays) {
      cpu::attention_forward_head((S*)out, lse, (const S*)qkv, docs, b, h, T, cols, arrays);
    });
  });
}

void attention_backward(void* dqkv, const void* dout, const void* qkv, const void* out,
                        const float* lse, int B, int T, int NH, int NKV, int HS, DType dt,
                        Stream s, const int* docs) {
  OP_SPAN(attention_backward);
  if (is_dry(s)) return;
  const cpu::QkvColumns cols = cpu::qkv_columns(NH, NKV, HS, "attention");
  cpu::dispatch_dtype(dt, [&](auto tag) {
    using S = decltype(tag);
    cpu::for_each_head(B, NKV, T, HS, s, [&](int b, int g, cpu::HeadArrays& arrays) {
      cpu::attention_backward_kv_head((S*)dqkv, (const S*)dout, (const S*)qkv, (const S*)out,
                                      lse, docs, b, g, T, cols, arrays);
    });
  });
}

}  // namespace ops
