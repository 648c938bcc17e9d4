// model/moe.cu - the mixture-of-experts MLP of an MoE block (model/moe.h).
//
// The math, per token x (a row of ln2, C channels), with E experts of hidden size D:
//
//   z = x W_r^T                      router logits (E), W_r (E,C), no bias; fp32 from here on
//   p = softmax(z)                   over all E experts
//   chosen = the top_k experts by p (a tie goes to the lower index)
//   g_e = p_e / sum_{chosen} p       the gates (top_k = 1: the raw p_e)
//   out = sum_{e chosen} g_e * (gelu(x W_fc,e^T + b_fc,e) W_proj,e^T + b_proj,e)
//
// Llama's experts are Mixtral's SwiGLU MLPs without biases: h = x W_fc,e^T = [gate | up] (2D),
// out_e = (silu(gate) * up) W_proj,e^T; h then holds 2D columns, hg (the SwiGLU output) D.
//
// Options ([model] router_score, n_shared_experts; [train] moe_balance, moe_capacity_factor):
//   sigmoid scores: p = sigmoid(z) instead of the softmax; the gates are the same formulas (the
//     chosen p normalised over the top_k; top_k = 1: the raw p). lse, for the z-loss, stays
//     logsumexp(z), and the balance loss' P_e is the mean sigmoid score.
//   balancing biases (DeepSeek-V3's auxiliary-loss-free balancing): every MoE layer has a bias
//     b_e per expert, added to the scores for the choice only: chosen = the top_k by p + b; the
//     gates stay the unbiased p. After each applied optimizer step b_e += moe_bias_rate *
//     sign(mean_e' load - load_e), the loads being the step's pairs that chose each expert,
//     summed over every rank that routes for the layer (dp x cp x tp-with-sp ranks and the
//     micro-batches: the world sum of moe_step_report, where each stage holds its own layers)
//     so every replica moves its biases alike. They are state: the checkpoint keeps them.
//   shared experts: n_shared_experts MLPs of hidden d_expert that every token runs, summed with
//     the routed output; held as one MLP of hidden n_shared_experts * d_expert in the block's
//     dense-MLP tensors and run by model/gpt.cu's dense MLP code (split over tp like it):
//     out = residual + shared(x) + routed(x).
//   capacity (training only; validation, evaluation and sampling run dropless): each expert
//     takes at most cap = ceil(factor * tokens * top_k / E) pairs of a micro-batch, tokens being
//     the micro-batch's B * seq_len wherever its positions sit, walked in token order (sequence,
//     position) then slot order; a dropped pair contributes zero and its gate gets no gradient
//     (model/moe_balance.cu). The balance loss still counts the router's choices.
// Otherwise dropless: every token reaches all its experts. The router's choice has no
// gradient; the gates do, through p, to W_r.
//
// Two losses steer the router, both added to the language-model loss:
//   load balance (per sequence s, E experts, T positions):
//     f_{s,e} = (slots of s's tokens that chose e) / (T * top_k)     a count: no gradient
//     P_{s,e} = mean over s's tokens of p_e
//     aux_s   = E * sum_e f_{s,e} P_{s,e}     (1 when balanced; E/top_k when all pick the same)
//     term    = moe_aux_loss * mean over the global batch's sequences, summed over MoE layers
//   z-loss: moe_z_loss * mean over tokens of logsumexp(z)^2, summed over MoE layers (keeps the
//     logits small, so the fp32 softmax stays accurate)
// Per sequence makes the loss independent of the layout: a sequence may be split over context-
// parallel ranks and sequence-parallel ranks, so its expert counts are summed over those ranks
// first (two small integer all-reduces); then every rank knows f for its tokens, and the
// gradient of the term w.r.t. p_{t,e} is moe_aux_loss * E * f_{s,e} / (T * sequences): the scale
// the LM loss gives each token, 1 / (T * sequences), times moe_aux_loss * E * f_{s,e}.
//
// The pipeline of one layer's forward (this rank's Nt tokens; the two trips are those of
// parallel/expert_parallel.cu, the identity with ep = 1):
//   router GEMM -> moe_router_forward -> choices to the host (the one sync: the dispatch plan is
//   made there) -> balance statistics -> route -> gather the pairs' rows into expert order ->
//   [to the experts' ranks] -> fc + GELU, proj (each one grouped GEMM over all local experts)
//   -> [back home] -> combine with the gates, + residual.
// The backward runs it in reverse: combine backward (d rows, d gates), [to the experts], the
// expert GEMMs' backward, [home], unpermute backward (each token sums its top_k rows), then the
// router: d gates + the balance gradient + the z-loss through the softmax, and the router GEMM's
// backward, whose input gradient adds to the experts'.
//
// Under tensor parallelism the experts are not split: each tp rank runs its own tokens (its N/tp
// with sequence parallelism, when their gradients are partial sums over tp like the
// LayerNorms'; without it every tp rank runs the same tokens). Under pipeline and context
// parallelism a layer sees its rank's tokens and nothing else changes.
#include "model/moe.h"

#include <algorithm>

#include "model/gpt.h"
#include "model/moe_balance.h"

// ---------------------------------------------------------------------------------------------
// Buffers
// ---------------------------------------------------------------------------------------------
// Columns of an expert's fc output h: D, or Llama's [gate | up] 2D.
static size_t fc_cols(const GPTLayout& g) { return (size_t)g.d_expert * (g.llama ? 2 : 1); }

MoeActs* moe_new_acts(GPT& m) {
  const GPTLayout& g = m.layout;
  MoeState& st = *m.moe;
  const size_t Nt = g.tp.tokens(m.B * m.T);
  const size_t E = g.E, k = g.top_k, C = g.C, D = g.d_expert, H = fc_cols(g);
  const size_t a = dtype_size(m.dt);
  const size_t rows = st.max_rows;
  MoeActs* acts = new MoeActs;
  st.owned_acts.push_back(acts);
  MoeActs& x = *acts;
  x.logits = (float*)gpt_new_buffer(m, Nt * E * 4);
  x.probs = (float*)gpt_new_buffer(m, Nt * E * 4);
  x.lse = (float*)gpt_new_buffer(m, Nt * 4);
  x.gate = (float*)gpt_new_buffer(m, Nt * k * 4);
  x.expert = (int*)gpt_new_buffer(m, Nt * k * 4);
  const bool block = m.recompute == Recompute::Block;
  x.x = block ? st.shared.x : gpt_new_buffer(m, rows * C * a);
  x.h = block ? st.shared.h : gpt_new_buffer(m, rows * H * a);
  x.hg = m.recompute != Recompute::None ? st.shared.hg : gpt_new_buffer(m, rows * D * a);
  x.y = block ? st.shared.y : gpt_new_buffer(m, Nt * k * C * a);
  x.dy = m.split_backward ? gpt_new_buffer(m, rows * C * a) : nullptr;
  ep_route_create(x.route, st.ep, (int)Nt, m.memory);
  return acts;
}

void moe_create(GPT& m) {
  const GPTLayout& g = m.layout;
  if (g.E == 0) return;
  MoeState* st = new MoeState;
  m.moe = st;
  st->ep = ExpertParallel{g.ep, g.E, g.top_k};
  st->aux_coef = m.moe_aux_loss;
  st->z_coef = m.moe_z_loss;
  st->score = m.moe_router_score;
  st->capacity_factor = m.moe_capacity_factor;
  st->bias_rate = m.moe_bias_rate;
  if (m.moe_bias_balance) {
    st->bias.assign((size_t)g.L * g.E, 0.0f);
    st->bias_device = (float*)gpt_new_buffer(m, st->bias.size() * sizeof(float));  // zeroed
  }
  const int Nt = g.tp.tokens(m.B * m.T);
  const size_t E = g.E, k = g.top_k, C = g.C, D = g.d_expert, H = fc_cols(g);
  const size_t a = dtype_size(m.dt);
  const size_t rows = st->max_rows = st->ep.max_expert_rows(Nt), trip = st->ep.trip_rows(Nt);
  st->send = gpt_new_buffer(m, trip * C * a);  // the trips' scratch: none with ep = 1
  st->recv = gpt_new_buffer(m, trip * C * a);
  st->expert_out = gpt_new_buffer(m, trip * C * a);
  st->d_expert = gpt_new_buffer(m, trip * C * a);
  st->d_rows = gpt_new_buffer(m, Nt * k * C * a);
  st->dh = gpt_new_buffer(m, rows * H * a);
  if (g.llama) st->dhg = gpt_new_buffer(m, rows * D * a);
  st->dgate = (float*)gpt_new_buffer(m, Nt * k * 4);
  st->dprobs = (float*)gpt_new_buffer(m, Nt * E * 4);
  st->dlogits = (float*)gpt_new_buffer(m, Nt * E * 4);
  st->logits_dt = m.dt == DType::F32 ? nullptr : gpt_new_buffer(m, Nt * E * a);
  st->d_router_in = gpt_new_buffer(m, Nt * C * a);
  if (m.recompute != Recompute::None) st->shared.hg = gpt_new_buffer(m, rows * D * a);
  if (m.recompute == Recompute::Block) {
    st->shared.x = gpt_new_buffer(m, rows * C * a);
    st->shared.h = gpt_new_buffer(m, rows * H * a);
    st->shared.y = gpt_new_buffer(m, Nt * k * C * a);
  }
  if (g.shared_hidden > 0) st->shared_sum = gpt_new_buffer(m, (size_t)Nt * C * a);
  st->stats.tokens.assign(g.L, {});
  st->stats.dropped.assign(g.L, 0.0);
}

void moe_destroy(GPT& m) {
  if (!m.moe) return;
  for (MoeActs* a : m.moe->owned_acts) delete a;  // their buffers are the model's memory
  delete m.moe;
  m.moe = nullptr;
}

// ---------------------------------------------------------------------------------------------
// Forward
// ---------------------------------------------------------------------------------------------
// A device buffer's contents on the host, once the stream has written it. On the dry stream (the
// planner's) nothing is copied: dst keeps what it holds.
static void read_to_host(void* dst, const void* src, size_t bytes, ops::Stream s) {
  ops::copy_to_host_async(dst, src, bytes, s);
  ops::stream_sync(s);
}

void moe_route_from_device(int* expert, const int* device_expert, int pairs, int E,
                           ops::Stream s) {
  read_to_host(expert, device_expert, (size_t)pairs * sizeof(int), s);
}

// The router: logits (fp32), then softmax, top-k and gates.
static void router_forward(GPT& m, MoeActs& a, int layer, const void* inp, const void* router_w,
                           int Nt, ops::Stream s) {
  const GPTLayout& g = m.layout;
  const MoeState& st = *m.moe;
  void* z = m.dt == DType::F32 ? (void*)a.logits : st.logits_dt;
  ops::matmul_forward(z, nullptr, inp, router_w, nullptr, nullptr, Nt, g.C, g.E, m.dt, s);
  if (z != a.logits) ops::cast(a.logits, DType::F32, z, m.dt, (size_t)Nt * g.E, s);
  const float* bias = st.bias_device ? st.bias_device + (size_t)layer * g.E : nullptr;
  ops::moe_router_forward(a.logits, Nt, g.E, g.top_k, a.expert, a.gate, a.probs, a.lse, s,
                          st.score, bias);
}

// The step's statistics of one layer: tokens per expert, the two loss terms (this rank's share).
static void record_stats(GPT& m, int layer, const std::vector<int>& expert,
                         const std::vector<float>& lse, double balance_share, float dloss_scale) {
  MoeStepStats& st = m.moe->stats;
  std::vector<double>& tokens = st.tokens[layer];
  tokens.resize(m.layout.E, 0.0);
  std::vector<int> chosen(m.layout.E, 0);  // the router's choices, before any capacity drop
  for (int e : expert) chosen[e]++;
  for (int e = 0; e < m.layout.E; e++) tokens[e] += chosen[e];
  double z = 0;
  for (float x : lse) z += (double)x * x;
  st.aux_loss += balance_share;
  st.z_loss += (double)m.moe->z_coef * dloss_scale * z;
}

// Each local expert's rows through fc + GELU and proj: x (M,C) -> y (M,C), expert-major. Each
// GEMM runs all local experts at once (ops::grouped_matmul_*: one launch in the CUDA backend),
// the experts' row counts from the route (host).
static void experts_forward(GPT& m, MoeActs& a, const ExpertWeights& w, void* y, ops::Stream s) {
  const GPTLayout& g = m.layout;
  const int C = g.C, D = g.d_expert, H = (int)fc_cols(g), experts = m.moe->ep.experts_per_rank();
  const int* rows = a.route.expert_rows.data();
  if (g.llama) {  // h = [gate | up], hg = silu(gate) * up
    ops::grouped_matmul_forward(a.h, nullptr, a.x, w.fc_w, nullptr, rows, experts, C, H, m.dt, s);
    if (a.route.M > 0) ops::swiglu_forward(a.hg, a.h, a.route.M, D, m.dt, s);
  } else {
    ops::grouped_matmul_forward(a.hg, a.h, a.x, w.fc_w, w.fc_b, rows, experts, C, D, m.dt, s);
  }
  ops::grouped_matmul_forward(y, nullptr, a.hg, w.proj_w, w.proj_b, rows, experts, D, C, m.dt, s);
}

// The pairs' rows along the route to this rank's experts, through them, and back home:
// inp (Nt,C) -> a.x (expert-major) -> a.h, a.hg -> a.y (Nt*top_k rows, dispatch order).
static void run_experts(GPT& m, MoeActs& a, const void* inp, const ExpertWeights& w, int Nt,
                        ops::Stream s) {
  MoeState& st = *m.moe;
  const int C = m.layout.C;
  void* rows = ep_trip_buffer(st.ep, st.send, a.x);  // with ep = 1 the trips are in place
  void* expert_out = ep_trip_buffer(st.ep, st.expert_out, a.y);
  ops::moe_permute(rows, inp, a.route.token_of_row, a.route.plan.kept, C, m.dt, s);
  ep_to_experts(st.ep, a.route, rows, a.x, st.recv, C, m.dt, s);
  experts_forward(m, a, w, expert_out, s);
  ep_to_home(st.ep, a.route, expert_out, a.y, st.send, C, m.dt, s);
}

void moe_recompute(GPT& m, MoeActs& a, const void* inp, const ExpertWeights& w, int B, int T,
                   ops::Stream s) {
  run_experts(m, a, inp, w, m.layout.tp.tokens(B * T), s);
}

void moe_forward(GPT& m, MoeActs& a, int layer, void* out, const void* inp, const void* residual,
                 const void* router_w, const ExpertWeights& w, int B, int T, float dloss_scale,
                 ops::Stream s) {
  const GPTLayout& g = m.layout;
  MoeState& st = *m.moe;
  const int Nt = g.tp.tokens(B * T), k = g.top_k, C = g.C;
  router_forward(m, a, layer, inp, router_w, Nt, s);
  std::vector<int> expert((size_t)Nt * k);
  m.moe_route_source(expert.data(), a.expert, Nt * k, g.E, s);  // waits: the one sync
  if (dloss_scale != 0) {  // training: the balance gradient and the step's statistics
    std::vector<float> probs((size_t)Nt * g.E), lse(Nt);
    read_to_host(probs.data(), a.probs, probs.size() * sizeof(float), s);
    read_to_host(lse.data(), a.lse, lse.size() * sizeof(float), s);
    const double share = moe_balance(m, a, expert, probs, B, T, dloss_scale);
    record_stats(m, layer, expert, lse, share, dloss_scale);
    if (st.capacity_factor > 0) st.stats.dropped[layer] += moe_drop_over_capacity(m, expert, B, T);
  }
  ep_route(a.route, st.ep, expert.data(), Nt, s);  // the dispatch is planned on the host

  run_experts(m, a, inp, w, Nt, s);
  ops::moe_combine(out, a.y, a.gate, a.route.position, Nt, k, C, m.dt, s);
  ops::add_bias_residual(out, out, nullptr, residual, Nt, C, m.dt, s);
}

// ---------------------------------------------------------------------------------------------
// Backward
// ---------------------------------------------------------------------------------------------
// The expert GEMMs' backward, in place: dy (M,C) expert-major holds d(expert output) on entry
// and d(expert input) on exit. part Input: no weight gradients (dw unused); d(expert output) is
// kept in a.dy and d(h) in a.h for the weight pass.
static void experts_backward(GPT& m, MoeActs& a, const ExpertWeights& w, const ExpertWeights& dw,
                             void* dy, GradPart part, ops::Stream s) {
  const GPTLayout& g = m.layout;
  const size_t C = g.C, D = g.d_expert, H = fc_cols(g), e = dtype_size(m.dt);
  MoeState& st = *m.moe;
  const ExpertRoute& r = a.route;
  const bool split = part == GradPart::Input;
  if (m.recompute == Recompute::Gelu && r.M > 0) {  // ("block" recomputed it with the rest)
    if (g.llama) ops::swiglu_forward(a.hg, a.h, r.M, (int)D, m.dt, s);
    else ops::gelu_forward(a.hg, a.h, (size_t)r.M * D, m.dt, s);
  }
  if (split) ops::copy_on_device(a.dy, dy, (size_t)r.M * C * e, s);
  const int* rows = r.expert_rows.data();
  const int experts = st.ep.experts_per_rank();
  const ExpertWeights gw = split ? ExpertWeights{} : dw;  // the weight gradients, when they run
  if (g.llama) {  // d hg = dy Wp, then d h = [d gate | d up]
    ops::grouped_matmul_backward(st.dhg, (float*)gw.proj_w, nullptr, dy, a.hg, w.proj_w, nullptr,
                                 rows, experts, (int)D, (int)C, m.dt, s);
    if (r.M > 0) ops::swiglu_backward(st.dh, st.dhg, a.h, r.M, (int)D, m.dt, s);
  } else {
    ops::grouped_matmul_backward(st.dh, (float*)gw.proj_w, (float*)gw.proj_b, dy, a.hg, w.proj_w,
                                 a.h, rows, experts, (int)D, (int)C, m.dt, s);
  }
  // d(expert input) overwrites dy, which the GEMMs above have finished reading
  ops::grouped_matmul_backward(dy, (float*)gw.fc_w, (float*)gw.fc_b, st.dh, a.x, w.fc_w, nullptr,
                               rows, experts, (int)C, (int)H, m.dt, s);
  if (split) ops::copy_on_device(a.h, st.dh, (size_t)r.M * H * e, s);
}

// The router's backward: the gates' gradient, the balance gradient and the z-loss through the
// softmax into the logits, then the router GEMM (its input gradient into d_router_in). part
// Input: no weight gradient; d(logits) kept in a.logits (fp32) for the weight pass.
static void router_backward(GPT& m, MoeActs& a, const void* inp, const void* router_w,
                            float* d_router_w, int Nt, float dloss_scale, GradPart part,
                            ops::Stream s) {
  const GPTLayout& g = m.layout;
  MoeState& st = *m.moe;
  ops::copy_to_device_async(st.dprobs, a.balance_grad.data(), a.balance_grad.size() * 4, s);
  ops::moe_router_backward(st.dlogits, a.probs, a.expert, a.gate, st.dgate, st.dprobs, a.lse,
                           st.z_coef * dloss_scale, Nt, g.E, g.top_k, s, st.score, a.logits);
  if (part == GradPart::Input)
    ops::copy_on_device(a.logits, st.dlogits, (size_t)Nt * g.E * sizeof(float), s);
  void* dz = st.dlogits;
  if (m.dt != DType::F32) {
    ops::cast(st.logits_dt, m.dt, st.dlogits, DType::F32, (size_t)Nt * g.E, s);
    dz = st.logits_dt;
  }
  ops::matmul_backward(st.d_router_in, part == GradPart::Input ? nullptr : d_router_w, nullptr,
                       dz, inp, router_w, nullptr, Nt, g.C, g.E, m.dt, s);
}

void moe_backward(GPT& m, MoeActs& a, void* dinp, const void* dout, const void* inp,
                  const void* router_w, float* d_router_w, const ExpertWeights& w,
                  const ExpertWeights& dw, int B, int T, float dloss_scale, GradPart part,
                  ops::Stream s) {
  const GPTLayout& g = m.layout;
  MoeState& st = *m.moe;
  const int Nt = g.tp.tokens(B * T), k = g.top_k, C = g.C;
  void* d_expert = ep_trip_buffer(st.ep, st.d_expert, st.d_rows);  // ep = 1: in place
  ops::moe_combine_backward(st.d_rows, st.dgate, dout, a.y, a.gate, a.route.position, Nt, k, C,
                            m.dt, s);
  ep_to_experts(st.ep, a.route, st.d_rows, d_expert, st.recv, C, m.dt, s);
  experts_backward(m, a, w, dw, d_expert, part, s);
  ep_to_home(st.ep, a.route, d_expert, st.d_rows, st.send, C, m.dt, s);
  ops::moe_unpermute_backward(dinp, st.d_rows, a.route.position, Nt, k, C, m.dt, s);
  router_backward(m, a, inp, router_w, d_router_w, Nt, dloss_scale, part, s);
  ops::add_bias_residual(dinp, dinp, nullptr, st.d_router_in, Nt, C, m.dt, s);
}

void moe_weight_pass(GPT& m, const MoeActs& a, const void* inp, float* d_router_w,
                     const ExpertWeights& dw, int B, int T, ops::Stream s) {
  const GPTLayout& g = m.layout;
  MoeState& st = *m.moe;
  const int Nt = g.tp.tokens(B * T);
  const int C = g.C, D = g.d_expert, H = (int)fc_cols(g);
  const int* rows = a.route.expert_rows.data();  // d(output) in dy, d(h) in h
  const int experts = st.ep.experts_per_rank();
  ops::grouped_matmul_backward(nullptr, (float*)dw.proj_w, (float*)dw.proj_b, a.dy, a.hg, nullptr,
                               nullptr, rows, experts, D, C, m.dt, s);
  ops::grouped_matmul_backward(nullptr, (float*)dw.fc_w, (float*)dw.fc_b, a.h, a.x, nullptr,
                               nullptr, rows, experts, C, H, m.dt, s);
  const void* dz = a.logits;  // d(router logits), fp32
  if (m.dt != DType::F32) {
    ops::cast(st.logits_dt, m.dt, a.logits, DType::F32, (size_t)Nt * g.E, s);
    dz = st.logits_dt;
  }
  ops::matmul_backward(nullptr, d_router_w, nullptr, dz, inp, nullptr, nullptr, Nt, g.C, g.E,
                       m.dt, s);
}
