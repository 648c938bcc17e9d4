// kernels/cpu/attention_merge.cpp - ring attention's merge of a partial attention result into an
// accumulated one, in place (the contract is in kernels/ops_decls.h): per (b, t, head),
//   lse_new = hi + log1p(exp(lo - hi))  with hi, lo = max, min(lse, lse_b)
//   out     = out * exp(lse - lse_new) + out_b * exp(lse_b - lse_new),   lse = lse_new
// An empty block (lse_b = -inf) changes nothing; an empty accumulator (lse = -inf) takes the
// block as it is. fp32 math, out rounded once to its dtype.
//
// Parallelism: rows (b, t) in parallel; each row is independent and computed the same way on any
// thread count, so results are bitwise the same for any number of threads.
#include <cmath>

#include "kernels/cpu/cpu_common.h"

namespace ops {
namespace cpu {
namespace {

// The weights of the accumulator (wa) and of the block (wb), and the new lse, of one head.
struct MergeWeights {
  float wa, wb, lse;
};
MergeWeights merge_weights(float la, float lb) {
  if (lb == -INFINITY) return {1.0f, 0.0f, la};  // empty block: unchanged (also both -inf)
  if (la == -INFINITY) return {0.0f, 1.0f, lb};  // empty accumulator: take the block
  // exp(la - lse_new) and exp(lb - lse_new) from the difference alone, e = exp(lo - hi) in
  // (0, 1]: the larger side weighs 1 / (1 + e), the smaller e / (1 + e). Not rounding lse_new
  // first keeps the weights exact to fp32 even when lse is large (ulp(1000) = 6e-5).
  const float hi = std::max(la, lb), lo = std::min(la, lb);
  const float e = std::exp(lo - hi), w_hi = 1.0f / (1.0f + e), w_lo = e * w_hi;
  const float lse_new = hi + std::log1p(e);
  return la >= lb ? MergeWeights{w_hi, w_lo, lse_new} : MergeWeights{w_lo, w_hi, lse_new};
}

// One (b, t) row: NH heads of HS columns. lse and lse_b point at head 0 of this (b, t); heads are
// T floats apart in the (B, NH, T) layout. A zero weight drops its term, so an empty side's
// values (whatever they hold) never enter.
template <typename Elem>
void merge_row(Elem* out, float* lse, const Elem* out_b, const float* lse_b, int NH, int HS,
               int T) {
  for (int h = 0; h < NH; h++) {
    const MergeWeights w = merge_weights(lse[(size_t)h * T], lse_b[(size_t)h * T]);
    Elem* o = out + (size_t)h * HS;
    const Elem* ob = out_b + (size_t)h * HS;
    for (int d = 0; d < HS; d++) {
      float x = 0.0f;
      if (w.wa != 0.0f) x += load(o, d) * w.wa;
      if (w.wb != 0.0f) x += load(ob, d) * w.wb;
      store(o, d, x);
    }
    lse[(size_t)h * T] = w.lse;
  }
}

}  // namespace
}  // namespace cpu

void attention_merge(void* out, float* lse, const void* out_b, const float* lse_b, int B, int T,
                     int NH, int HS, DType dt, Stream s) {
  OP_SPAN(attention_merge);
  if (is_dry(s)) return;
  const int C = NH * HS;
  cpu::dispatch_dtype(dt, [&](auto tag) {
    using S = decltype(tag);
#pragma omp parallel for schedule(static) if ((size_t)B * T * C > CPU_PARALLEL_MIN)
    for (long row = 0; row < (long)B * T; row++) {
      const int b = (int)(row / T), t = (int)(row % T);
      const size_t lse_at = (size_t)b * NH * T + t;
      cpu::merge_row((S*)out + (size_t)row * C, lse + lse_at, (const S*)out_b + (size_t)row * C,
                     lse_b + lse_at, NH, HS, T);
    }
  });
}

}  // namespace ops
