// kernels/cpu/moe_router.cpp - the mixture-of-experts router, CPU backend (contracts in
// kernels/ops_decls.h): from the router logits z (N,E), fp32 throughout,
//   forward:  p = softmax(z) (or sigmoid(z)), lse = logsumexp(z), the top_k experts of each token
//             (chosen on z, or on p + b with balancing biases b; decreasing, ties to the lower
//             index) and their gates (p renormalised over the chosen experts when top_k > 1, the
//             raw p when top_k == 1);
//   backward: dz through the gates, the load-balancing loss' dp (given: model/moe.cu makes it on
//             the host) and the z-loss, per row.
//
// Parallelism: token rows in parallel. Every row is computed the same way on any thread count,
// so results are bitwise the same for any number of threads.
#include <cmath>

#include "kernels/cpu/cpu_common.h"

namespace ops {
namespace cpu {
namespace {

// True when expert a (logit za) ranks before expert b (logit zb): larger logit, then lower index.
inline bool ranks_before(float za, int a, float zb, int b) {
  return za > zb || (za == zb && a < b);
}

// One token's scores p (softmax or sigmoid) and lse = logsumexp(z).
void router_scores_row(const float* z, int E, RouterScore score, float* p, float* lse) {
  float m = -INFINITY;
  for (int e = 0; e < E; e++) m = std::max(m, z[e]);
  float sum = 0.0f;
  if (score == RouterScore::Sigmoid) {
    for (int e = 0; e < E; e++) sum += std::exp(z[e] - m);
    for (int e = 0; e < E; e++) p[e] = 1.0f / (1.0f + std::exp(-z[e]));
  } else {
    for (int e = 0; e < E; e++) sum += p[e] = std::exp(z[e] - m);
    for (int e = 0; e < E; e++) p[e] /= sum;
  }
  *lse = m + std::log(sum);
}

// One token: its scores, then top_k rounds of "the best expert ranking after the previous pick"
// (no list of chosen experts needed: each pick ranks strictly after the one before). Ranked on
// z without a bias (the scores' order, without their rounding), on p + b with one.
void router_forward_row(const float* z, int E, int top_k, RouterScore score, const float* bias,
                        int* expert, float* gate, float* p, float* lse) {
  router_scores_row(z, E, score, p, lse);
  auto key = [&](int e) { return bias ? p[e] + bias[e] : z[e]; };
  int prev = -1;
  for (int j = 0; j < top_k; j++) {
    int best = -1;
    for (int e = 0; e < E; e++) {
      const bool after_prev = prev < 0 || ranks_before(key(prev), prev, key(e), e);
      if (after_prev && (best < 0 || ranks_before(key(e), e, key(best), best))) best = e;
    }
    expert[j] = best;
    gate[j] = p[best];
    prev = best;
  }
  if (top_k > 1) {
    float S = 0.0f;
    for (int j = 0; j < top_k; j++) S += gate[j];
    for (int j = 0; j < top_k; j++) gate[j] = gate[j] / S;
  }
}

// dp_e of one row for expert e: the aux term plus, if e was chosen, the gate term (ops_decls.h).
inline float router_dp(int e, const float* dprobs_aux, const int* expert, const float* dgate,
                       int top_k, float S, float G) {
  float dp = dprobs_aux ? dprobs_aux[e] : 0.0f;
  for (int j = 0; j < top_k; j++)
    if (expert[j] == e) dp += top_k == 1 ? dgate[0] : (dgate[j] - G) / S;
  return dp;
}

void router_backward_row(float* dz, const float* p, const int* expert, const float* gate,
                         const float* dgate, const float* dprobs_aux, float lse, float z_coef,
                         int E, int top_k, RouterScore score, const float* z) {
  float S = 0.0f, G = 0.0f;
  for (int j = 0; j < top_k; j++) {
    S += p[expert[j]];
    G += dgate[j] * gate[j];
  }
  const float zl = 2.0f * z_coef * lse;
  if (score == RouterScore::Sigmoid) {
    for (int e = 0; e < E; e++) {
      const float dp = router_dp(e, dprobs_aux, expert, dgate, top_k, S, G);
      dz[e] = dp * (p[e] * (1.0f - p[e])) + zl * std::exp(z[e] - lse);
    }
    return;
  }
  float dot = 0.0f;  // sum_f p_f dp_f
  for (int e = 0; e < E; e++) dot += p[e] * router_dp(e, dprobs_aux, expert, dgate, top_k, S, G);
  for (int e = 0; e < E; e++) {
    const float dp = router_dp(e, dprobs_aux, expert, dgate, top_k, S, G);
    dz[e] = p[e] * (dp - dot) + zl * p[e];
  }
}

}  // namespace
}  // namespace cpu

void moe_router_forward(const float* logits, int N, int E, int top_k, int* expert, float* gate,
                        float* probs, float* lse, Stream s, RouterScore score,
                        const float* choice_bias) {
  OP_SPAN(moe_router_forward);
  if (is_dry(s)) return;
  if (top_k < 1 || top_k > E) FATAL("moe_router_forward: top_k %d not in [1, E = %d]", top_k, E);
#pragma omp parallel for schedule(static) if ((size_t)N * E > CPU_PARALLEL_MIN)
  for (long n = 0; n < (long)N; n++)
    cpu::router_forward_row(logits + (size_t)n * E, E, top_k, score, choice_bias,
                            expert + (size_t)n * top_k,
                            gate + (size_t)n * top_k, probs + (size_t)n * E, lse + n);
}

void moe_router_backward(float* dlogits, const float* probs, const int* expert, const float* gate,
                         const float* dgate, const float* dprobs_aux, const float* lse,
                         float z_coef, int N, int E, int top_k, Stream s, RouterScore score,
                         const float* logits) {
  OP_SPAN(moe_router_backward);
  if (is_dry(s)) return;
  if (score == RouterScore::Sigmoid && !logits)
    FATAL("moe_router_backward: sigmoid scores need the logits");
#pragma omp parallel for schedule(static) if ((size_t)N * E > CPU_PARALLEL_MIN)
  for (long n = 0; n < (long)N; n++) {
    const size_t r = (size_t)n * E, rk = (size_t)n * top_k;
    cpu::router_backward_row(dlogits + r, probs + r, expert + rk, gate + rk, dgate + rk,
                             dprobs_aux ? dprobs_aux + r : nullptr, lse[n], z_coef, E, top_k,
                             score, logits ? logits + r : nullptr);
  }
}

}  // namespace ops
