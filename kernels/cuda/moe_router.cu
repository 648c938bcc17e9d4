// kernels/cuda/moe_router.cu - the mixture-of-experts router, CUDA backend (contracts in
// kernels/ops_decls.h): from the router logits z (N,E), fp32 throughout,
//   forward:  p = softmax(z) (or sigmoid(z)), lse = logsumexp(z), the top_k experts of each token
//             (chosen on z, or on p + b with balancing biases b; decreasing, ties to the lower
//             index) and their gates (p renormalised over the chosen experts when top_k > 1, the
//             raw p when top_k == 1);
//   backward: dz through the gates, the load-balancing loss' dp (given: model/moe.cu makes it on
//             the host) and the z-loss, per row.
// The same formulas and the same per-row order of the small sums over slots as the CPU backend
// (kernels/cpu/moe_router.cpp); the sums over experts run as warp reductions here.
//
// Parallelisation:
// - forward and backward: one warp per token row (E is small, 8 to a few hundred), 4 rows per
//   block of 128 threads. Lanes stride over the row's E experts; max, sum and the dot product
//   are butterfly reductions (__shfl_xor), so every lane holds the same result. Top-k runs
//   top_k rounds of a warp arg-max over the experts that rank after the previous pick (larger
//   logit first, then lower index: a total order, so every lane agrees on the winner and no
//   list of chosen experts is kept). Lane 0 writes the row's experts and gates. No atomics:
//   deterministic run to run.
#include "kernels/cuda/cuda_common.cuh"

namespace ops {
namespace {

constexpr int kRowsPerBlock = 4;  // warps per block in the row kernels

__device__ __forceinline__ bool ranks_before(float za, int a, float zb, int b) {
  return za > zb || (za == zb && a < b);
}

// The expert ranking first among each lane's candidates, reduced over the warp. An empty
// candidate is idx = -1 (ranks after everything).
struct Pick {
  float z;
  int idx;
};
__device__ __forceinline__ Pick better(Pick a, Pick b) {
  if (a.idx < 0) return b;
  if (b.idx < 0) return a;
  return ranks_before(a.z, a.idx, b.z, b.idx) ? a : b;
}
__device__ __forceinline__ Pick warp_best(Pick x) {
  for (int o = 16; o > 0; o >>= 1) {
    Pick y{__shfl_xor_sync(0xffffffffu, x.z, o), __shfl_xor_sync(0xffffffffu, x.idx, o)};
    x = better(x, y);
  }
  return x;
}

__global__ void router_forward_kernel(const float* __restrict__ logits, int N, int E, int top_k,
                                      RouterScore score, const float* __restrict__ bias,
                                      int* expert, float* gate, float* probs, float* lse) {
  const int n = blockIdx.x * kRowsPerBlock + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (n >= N) return;  // the whole warp leaves together
  const float* z = logits + (size_t)n * E;
  const bool sigmoid = score == RouterScore::Sigmoid;
  float m = -INFINITY;
  for (int e = lane; e < E; e += 32) m = fmaxf(m, z[e]);
  m = warp_reduce_max(m);
  float sum = 0.0f;
  for (int e = lane; e < E; e += 32) sum += expf(z[e] - m);
  sum = warp_reduce_sum(sum);
  // The score of expert e: the same expression as the CPU backend's.
  auto score_of = [&](int e) {
    return sigmoid ? 1.0f / (1.0f + expf(-z[e])) : expf(z[e] - m) / sum;
  };
  for (int e = lane; e < E; e += 32) probs[(size_t)n * E + e] = score_of(e);
  if (lane == 0) lse[n] = m + logf(sum);
  // Ranked on z without a bias (the scores' order, without their rounding), on p + b with one.
  auto key = [&](int e) { return bias ? score_of(e) + bias[e] : z[e]; };
  Pick prev{0.0f, -1};
  float S = 0.0f;
  for (int j = 0; j < top_k; j++) {
    Pick best{0.0f, -1};
    for (int e = lane; e < E; e += 32) {
      const float k = key(e);
      if (prev.idx < 0 || ranks_before(prev.z, prev.idx, k, e)) best = better(best, {k, e});
    }
    best = warp_best(best);
    const float p = score_of(best.idx);  // the same expression as probs[] above
    S += p;
    if (lane == 0) {
      expert[(size_t)n * top_k + j] = best.idx;
      gate[(size_t)n * top_k + j] = p;
    }
    prev = best;
  }
  if (lane == 0 && top_k > 1)
    for (int j = 0; j < top_k; j++) gate[(size_t)n * top_k + j] /= S;
}

// dp_e of one row for expert e: the aux term plus, if e was chosen, the gate term (ops_decls.h).
__device__ __forceinline__ float router_dp(int e, const float* dprobs_aux, const int* expert,
                                           const float* dgate, int top_k, float S, float G) {
  float dp = dprobs_aux ? dprobs_aux[e] : 0.0f;
  for (int j = 0; j < top_k; j++)
    if (expert[j] == e) dp += top_k == 1 ? dgate[0] : (dgate[j] - G) / S;
  return dp;
}

__global__ void router_backward_kernel(float* dlogits, const float* __restrict__ probs,
                                       const int* __restrict__ expert,
                                       const float* __restrict__ gate,
                                       const float* __restrict__ dgate,
                                       const float* __restrict__ dprobs_aux,
                                       const float* __restrict__ lse, float z_coef, int N, int E,
                                       int top_k, RouterScore score,
                                       const float* __restrict__ logits) {
  const int n = blockIdx.x * kRowsPerBlock + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (n >= N) return;
  const float* p = probs + (size_t)n * E;
  const int* ex = expert + (size_t)n * top_k;
  const float* dg = dgate + (size_t)n * top_k;
  const float* da = dprobs_aux ? dprobs_aux + (size_t)n * E : nullptr;
  float S = 0.0f, G = 0.0f;  // every lane, in slot order (as the CPU does)
  for (int j = 0; j < top_k; j++) {
    S += p[ex[j]];
    G += dg[j] * gate[(size_t)n * top_k + j];
  }
  const float zl = 2.0f * z_coef * lse[n];
  if (score == RouterScore::Sigmoid) {
    const float* z = logits + (size_t)n * E;
    for (int e = lane; e < E; e += 32) {
      const float dp = router_dp(e, da, ex, dg, top_k, S, G);
      dlogits[(size_t)n * E + e] = dp * (p[e] * (1.0f - p[e])) + zl * expf(z[e] - lse[n]);
    }
    return;
  }
  float dot = 0.0f;
  for (int e = lane; e < E; e += 32) dot += p[e] * router_dp(e, da, ex, dg, top_k, S, G);
  dot = warp_reduce_sum(dot);
  for (int e = lane; e < E; e += 32) {
    const float dp = router_dp(e, da, ex, dg, top_k, S, G);
    dlogits[(size_t)n * E + e] = p[e] * (dp - dot) + zl * p[e];
  }
}

}  // namespace

void moe_router_forward(const float* logits, int N, int E, int top_k, int* expert, float* gate,
                        float* probs, float* lse, Stream s, RouterScore score,
                        const float* choice_bias) {
  OP_SPAN(moe_router_forward);
  if (is_dry(s)) return;
  if (top_k < 1 || top_k > E) FATAL("moe_router_forward: top_k %d not in [1, E = %d]", top_k, E);
  if (N <= 0) return;
  const int blocks = (N + kRowsPerBlock - 1) / kRowsPerBlock;
  router_forward_kernel<<<blocks, 32 * kRowsPerBlock, 0, s->stream>>>(
      logits, N, E, top_k, score, choice_bias, expert, gate, probs, lse);
  LAUNCH_CHECK();
}

void moe_router_backward(float* dlogits, const float* probs, const int* expert, const float* gate,
                         const float* dgate, const float* dprobs_aux, const float* lse,
                         float z_coef, int N, int E, int top_k, Stream s, RouterScore score,
                         const float* logits) {
  OP_SPAN(moe_router_backward);
  if (is_dry(s)) return;
  if (score == RouterScore::Sigmoid && !logits)
    FATAL("moe_router_backward: sigmoid scores need the logits");
  if (N <= 0) return;
  const int blocks = (N + kRowsPerBlock - 1) / kRowsPerBlock;
  router_backward_kernel<<<blocks, 32 * kRowsPerBlock, 0, s->stream>>>(
      dlogits, probs, expert, gate, dgate, dprobs_aux, lse, z_coef, N, E, top_k, score, logits);
  LAUNCH_CHECK();
}

}  // namespace ops
