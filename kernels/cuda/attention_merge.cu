// kernels/cuda/attention_merge.cu - ring attention's merge of a partial attention result into an
// accumulated one, in place (the contract is in kernels/ops_decls.h): per (b, t, head),
//   lse_new = hi + log1p(exp(lo - hi))  with hi, lo = max, min(lse, lse_b)
//   out     = out * exp(lse - lse_new) + out_b * exp(lse_b - lse_new),   lse = lse_new
// An empty block (lse_b = -inf) changes nothing; an empty accumulator (lse = -inf) takes the
// block as it is. fp32 math, out rounded once to its dtype; the same formula and order as the CPU
// backend (kernels/cpu/attention_merge.cpp), so the two differ only by expf/log1pf's last bits.
//
// Parallelisation: one thread block per (b, t) row. Its threads stride over the row's C columns;
// each recomputes the weights of its column's head from lse and lse_b (two loads and three
// transcendentals, cheap next to a memory-bound pass over out). The lse row is written only after
// a __syncthreads, by one thread per head, so no thread reads an lse that was already updated.
// Memory traffic: out read and written once, out_b read once: a streaming pass, far below the
// attention it follows.
#include "kernels/cuda/cuda_common.cuh"

namespace ops {
namespace {

constexpr int kThreads = 128;

// The weights of the accumulator (wa) and of the block (wb), and the new lse, of one head.
struct MergeWeights {
  float wa, wb, lse;
};
__device__ __forceinline__ MergeWeights merge_weights(float la, float lb) {
  if (lb == -INFINITY) return {1.0f, 0.0f, la};  // empty block: unchanged (also both -inf)
  if (la == -INFINITY) return {0.0f, 1.0f, lb};  // empty accumulator: take the block
  // exp(la - lse_new) and exp(lb - lse_new) from the difference alone, e = exp(lo - hi) in
  // (0, 1]: the larger side weighs 1 / (1 + e), the smaller e / (1 + e). Not rounding lse_new
  // first keeps the weights exact to fp32 even when lse is large (ulp(1000) = 6e-5).
  const float hi = fmaxf(la, lb), lo = fminf(la, lb);
  const float e = expf(lo - hi), w_hi = 1.0f / (1.0f + e), w_lo = e * w_hi;
  const float lse_new = hi + log1pf(e);
  return la >= lb ? MergeWeights{w_hi, w_lo, lse_new} : MergeWeights{w_lo, w_hi, lse_new};
}

template <typename T>
__global__ void attention_merge_kernel(T* out, float* lse, const T* __restrict__ out_b,
                                       const float* __restrict__ lse_b, int T_, int NH, int HS) {
  const int row = blockIdx.x;  // b * T + t
  const int b = row / T_, t = row % T_;
  const int C = NH * HS;
  const size_t lse_at = (size_t)b * NH * T_ + t;  // head h at lse_at + h * T
  T* o = out + (size_t)row * C;
  const T* ob = out_b + (size_t)row * C;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    const int h = c / HS;
    const size_t at = lse_at + (size_t)h * T_;
    const MergeWeights w = merge_weights(lse[at], lse_b[at]);
    // A zero weight drops its term, so an empty side's values (whatever they hold) never enter.
    float x = 0.0f;
    if (w.wa != 0.0f) x += to_float(o[c]) * w.wa;
    if (w.wb != 0.0f) x += to_float(ob[c]) * w.wb;
    o[c] = from_float<T>(x);
  }
  __syncthreads();
  for (int h = threadIdx.x; h < NH; h += blockDim.x) {
    const size_t at = lse_at + (size_t)h * T_;
    lse[at] = merge_weights(lse[at], lse_b[at]).lse;
  }
}

}  // namespace

void attention_merge(void* out, float* lse, const void* out_b, const float* lse_b, int B, int T,
                     int NH, int HS, DType dt, Stream s) {
  OP_SPAN(attention_merge);
  if (is_dry(s)) return;
  if (B <= 0 || T <= 0 || NH <= 0 || HS <= 0) return;
  dispatch_dtype(dt, [&](auto tag) {
    using S = decltype(tag);
    attention_merge_kernel<S><<<B * T, kThreads, 0, s->stream>>>(
        static_cast<S*>(out), lse, static_cast<const S*>(out_b), lse_b, T, NH, HS);
    LAUNCH_CHECK();
  });
}

}  // namespace ops
