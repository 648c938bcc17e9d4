// kernels/cpu/attention.cpp - causal multi-head self-attention over packed qkv (B,T,3C), forward
// (output and per-row log-sum-exp) and backward (recomputing the probabilities from the lse).
//
// Parallelism: one task per (batch, head), in parallel; a task is sequential, so results are
// bitwise the same for any thread count. A task gathers its head's q, k, v (and in the backward
// out, dout) out of the packed rows into contiguous fp32 arrays and runs the per-row arithmetic
// of attention_rows.h with a causal mask (row t sees keys 0..t): vectorised axpys in a fixed
// order, one row of scores at a time, no (T,T) matrix. Ring attention's block
// (attention_block.cpp) runs the same rows on its own gathers.
//
// Forward, per query row t: s = q.k / sqrt(HS) for j <= t, m = max s, p = exp(s - m),
// l = sum p (double), out = (sum p v) / l, lse = m + log l.
// Backward, per row, with p = exp(s - lse) recomputed from the saved lse and D = dout[t] . out[t]:
//   ds[j] = p[j] (dout[t] . v[j] - D) / sqrt(HS);  dq[t] = sum_j ds[j] k[j];  dk[j] += ds[j] q[t];
//   dv[j] += p[j] dout[t].   dk and dv are summed in fp32 over t and stored once at the end.
#include "kernels/cpu/attention_rows.h"

namespace ops {
namespace cpu {
namespace {

template <typename Elem>
void attention_forward_head(Elem* out, float* lse, const Elem* qkv, int b, int h, int T, int NH,
                            int HS, HeadArrays& a) {
  const int C = NH * HS;
  const Elem* rows = qkv + (size_t)b * T * 3 * C;
  gather_head(a.q, nullptr, rows, 3 * C, h * HS, T, HS);
  gather_head(a.k, a.kt, rows, 3 * C, C + h * HS, T, HS);
  gather_head(a.v, nullptr, rows, 3 * C, 2 * C + h * HS, T, HS);
  forward_rows(a, lse + ((size_t)b * NH + h) * T, T, HS, /*causal=*/true);
  scatter_head(out + (size_t)b * T * C, C, h * HS, a.out, T, HS);
}

template <typename Elem>
void attention_backward_head(Elem* dqkv, const Elem* dout, const Elem* qkv, const Elem* out,
                             const float* lse, int b, int h, int T, int NH, int HS, HeadArrays& a) {
  const int C = NH * HS;
  const Elem* rows = qkv + (size_t)b * T * 3 * C;
  gather_head(a.q, nullptr, rows, 3 * C, h * HS, T, HS);
  gather_head(a.k, a.kt, rows, 3 * C, C + h * HS, T, HS);
  gather_head(a.v, a.vt, rows, 3 * C, 2 * C + h * HS, T, HS);
  gather_head(a.out, nullptr, out + (size_t)b * T * C, C, h * HS, T, HS);
  gather_head(a.dout, nullptr, dout + (size_t)b * T * C, C, h * HS, T, HS);
  backward_rows(a, lse + ((size_t)b * NH + h) * T, T, HS, /*causal=*/true);
  Elem* drows = dqkv + (size_t)b * T * 3 * C;
  scatter_head(drows, 3 * C, h * HS, a.dq, T, HS);
  scatter_head(drows, 3 * C, C + h * HS, a.dk, T, HS);
  scatter_head(drows, 3 * C, 2 * C + h * HS, a.dv, T, HS);
}

}  // namespace
}  // namespace cpu

void attention_forward(void* out, float* lse, const void* qkv, int B, int T, int NH, int HS,
                       DType dt, Stream s) {
  if (is_dry(s)) return;
  cpu::dispatch_dtype(dt, [&](auto tag) {
    using S = decltype(tag);
    cpu::for_each_head(B, NH, T, HS, s, [&](int b, int h, cpu::HeadArrays& arrays) {
      cpu::attention_forward_head((S*)out, lse, (const S*)qkv, b, h, T, NH, HS, arrays);
    });
  });
}

void attention_backward(void* dqkv, const void* dout, const void* qkv, const void* out,
                        const float* lse, int B, int T, int NH, int HS, DType dt, Stream s) {
  if (is_dry(s)) return;
  cpu::dispatch_dtype(dt, [&](auto tag) {
    using S = decltype(tag);
    cpu::for_each_head(B, NH, T, HS, s, [&](int b, int h, cpu::HeadArrays& arrays) {
      cpu::attention_backward_head((S*)dqkv, (const S*)dout, (const S*)qkv, (const S*)out, lse, b,
                                   h, T, NH, HS, arrays);
    });
  });
}

}  // namespace ops
