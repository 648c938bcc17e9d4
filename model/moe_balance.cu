// model/moe_balance.cu - the MoE layer's bookkeeping on the host (model/moe.h, model/moe.cu):
// the load-balancing loss' counts and gradient, the capacity factor's drops, the step's
// statistics summed over the ranks, and the balancing biases of moe_balance = "bias" with their
// update after each step. The math is at the top of model/moe.cu.
//
// Who talks to whom. The counts of a sequence are summed over the ranks holding its tokens (tp
// ranks with sequence parallelism, cp ranks), and so are a micro-batch's choices before its
// capacity drops (each rank fills its own tokens' places of the micro-batch's B*T*top_k choices,
// 4 bytes each, in one host all-reduce per axis); the step's token counts, dropped pairs and
// loss terms are one host all-reduce over the world (L*E + L + 2 doubles), from which every rank
// moves its biases alike: nothing else is exchanged for them.
#include "model/moe_balance.h"

#include <algorithm>
#include <cmath>

#include "model/gpt.h"
#include "parallel/context_parallel.h"

// ---------------------------------------------------------------------------------------------
// The load-balancing statistics (host)
// ---------------------------------------------------------------------------------------------
// The sequence (0..B-1) of local token i: this rank's tokens are the rows [first, first + Nt)
// of the micro-batch's B x T local positions (T per sequence on this rank), stored chunk-major
// under context parallelism (parallel/tensor_parallel.h, TokenPositions).
struct SequenceOf {
  int first, B, len;
  int operator()(int i) const { return ((first + i) % (B * len)) / len; }
};

// Counts per (sequence, expert) over every rank holding part of the sequences, then the gradient
// of the balance term w.r.t. p for each local token (a.balance_grad) and this rank's share of the
// term's value. Returns that share (summed over all ranks: the term's value for the micro-batch).
double moe_balance(GPT& m, MoeActs& a, const std::vector<int>& expert,
                      const std::vector<float>& probs, int B, int T, float dloss_scale) {
  const GPTLayout& g = m.layout;
  const int E = g.E, k = g.top_k, Nt = g.tp.tokens(B * T);
  const bool sp = g.tp.sp && g.tp.size() > 1;
  const int chunks = g.cp->size > 1 ? 2 : 1;
  const SequenceOf seq{sp ? g.tp.rank() * Nt : 0, B, T / chunks};
  std::vector<int> counts((size_t)B * E, 0);
  for (int i = 0; i < Nt; i++)
    for (int j = 0; j < k; j++) counts[(size_t)seq(i) * E + expert[(size_t)i * k + j]]++;
  if (sp) all_reduce_host_sum(*g.tp.group, counts.data(), B * E);
  if (g.cp->size > 1) all_reduce_host_sum(*g.cp, counts.data(), B * E);
  // d term / d p_{t,e} = aux_coef * E * f_{s,e} / (T_full * sequences) = aux_coef * E * f *
  // dloss_scale, dloss_scale being 1 / (tokens of the global batch).
  const double T_full = (double)T * g.cp->size;
  const double scale = (double)m.moe->aux_coef * dloss_scale * E / (T_full * k);
  a.balance_grad.resize((size_t)Nt * E);
  double share = 0;
  for (int i = 0; i < Nt; i++)
    for (int e = 0; e < E; e++) {
      const size_t at = (size_t)i * E + e;
      a.balance_grad[at] = (float)(scale * counts[(size_t)seq(i) * E + e]);
      share += (double)a.balance_grad[at] * probs[at];
    }
  return share;
}

// ---------------------------------------------------------------------------------------------
// Capacity (training only)
// ---------------------------------------------------------------------------------------------
// The capacity factor's drops for one layer and micro-batch. The group is the micro-batch: its B
// sequences of T_full positions, wherever they sit (sequence-parallel ranks hold N/tp of the
// tokens, context-parallel ranks two zigzag chunks of every sequence), so every layout drops the
// pairs one rank would. Each expert takes at most cap = ceil(factor * tokens * top_k / E) pairs,
// walked in token order (sequence, then position) and, within a token, slot order (its best
// expert first); the rest are dropped. The ranks holding the micro-batch learn everyone's choices
// by a host sum (each rank fills its tokens' places, choice + 1, zeros elsewhere), decide alike,
// and mark their own dropped pairs kDroppedPair in `expert`. Returns the pairs dropped here.
double moe_drop_over_capacity(GPT& m, std::vector<int>& expert, int B, int T) {
  const GPTLayout& g = m.layout;
  const int E = g.E, k = g.top_k, Nt = g.tp.tokens(B * T);
  const bool sp = g.tp.sp && g.tp.size() > 1;
  const int T_full = T * g.cp->size, first = sp ? g.tp.rank() * Nt : 0;
  const TokenPositions pos = cp_positions_of(g.cp->size, g.cp->rank, B, T_full);
  auto global_token = [&](int i) {  // local token i -> sequence * T_full + position
    const int at = first + i, chunk = at / (B * pos.len), rest = at % (B * pos.len);
    return (rest / pos.len) * T_full + pos.first[chunk] + rest % pos.len;
  };
  std::vector<int> all((size_t)B * T_full * k, 0);
  for (int i = 0; i < Nt; i++)
    for (int j = 0; j < k; j++) all[(size_t)global_token(i) * k + j] = expert[(size_t)i * k + j] + 1;
  if (sp) all_reduce_host_sum(*g.tp.group, all.data(), (int)all.size());
  if (g.cp->size > 1) all_reduce_host_sum(*g.cp, all.data(), (int)all.size());
  const double cap = std::ceil((double)m.moe->capacity_factor * B * T_full * k / E);
  std::vector<int> taken(E, 0);
  for (int& x : all) {  // token order, then slot order; 0 now marks a dropped pair
    if (x < 1 || x > E) continue;  // (the planner's dry groups scale sums: not a choice)
    if (taken[x - 1] < cap) taken[x - 1]++;
    else x = 0;
  }
  double dropped = 0;
  for (int i = 0; i < Nt; i++)
    for (int j = 0; j < k; j++)
      if (all[(size_t)global_token(i) * k + j] == 0) {
        expert[(size_t)i * k + j] = kDroppedPair;
        dropped++;
      }
  return dropped;
}

// ---------------------------------------------------------------------------------------------
// Statistics
// ---------------------------------------------------------------------------------------------
MoeReport moe_step_report(GPT& m, Comm& world, int islands) {
  const GPTLayout& g = m.layout;
  MoeStepStats& st = m.moe->stats;
  // every layer's counts, the losses, then every layer's dropped pairs
  const size_t drops = (size_t)g.L * g.E + 2;
  std::vector<double> sums(drops + g.L, 0.0);
  for (int l = 0; l < g.L; l++)
    for (size_t e = 0; e < st.tokens[l].size(); e++) sums[(size_t)l * g.E + e] = st.tokens[l][e];
  sums[(size_t)g.L * g.E] = st.aux_loss;
  sums[(size_t)g.L * g.E + 1] = st.z_loss;
  for (int l = 0; l < g.L; l++) sums[drops + l] = st.dropped[l];
  all_reduce_host_sum(world, sums.data(), (int)sums.size());
  // Without sequence parallelism the tp ranks route the same tokens: count them once.
  const double copies = g.tp.size() > 1 && !g.tp.sp ? g.tp.size() : 1;
  for (double& x : sums) x /= copies;
  MoeReport r;
  r.aux_loss = sums[(size_t)g.L * g.E] / islands;
  r.z_loss = sums[(size_t)g.L * g.E + 1] / islands;
  for (int l = 0; l < g.L; l++) {
    if (!g.moe[l]) continue;
    MoeLayerReport lr;
    lr.layer = l;
    lr.tokens.assign(sums.begin() + (size_t)l * g.E, sums.begin() + (size_t)(l + 1) * g.E);
    lr.min = *std::min_element(lr.tokens.begin(), lr.tokens.end());
    lr.max = *std::max_element(lr.tokens.begin(), lr.tokens.end());
    double pairs = 0;
    for (double x : lr.tokens) lr.mean += x / g.E, pairs += x;
    lr.dropped = pairs > 0 ? sums[drops + l] / pairs : 0;
    r.layers.push_back(lr);
  }
  st = MoeStepStats{};
  st.tokens.assign(g.L, {});
  st.dropped.assign(g.L, 0.0);
  return r;
}

// ---------------------------------------------------------------------------------------------
// Balancing biases (moe_balance = "bias")
// ---------------------------------------------------------------------------------------------
void moe_bias_update(GPT& m, const MoeReport& r, ops::Stream s) {
  MoeState& st = *m.moe;
  if (st.bias.empty()) return;
  const int E = m.layout.E;
  for (const MoeLayerReport& l : r.layers) {  // the loads: integers, the same on every rank
    float* b = st.bias.data() + (size_t)l.layer * E;
    for (int e = 0; e < E; e++) {
      const double load = l.tokens[e];
      b[e] += load < l.mean ? st.bias_rate : load > l.mean ? -st.bias_rate : 0.0f;
    }
  }
  ops::copy_to_device_async(st.bias_device, st.bias.data(), st.bias.size() * sizeof(float), s);
}

std::vector<float> moe_bias_state(const GPT& m) {
  return m.moe ? m.moe->bias : std::vector<float>{};
}

void moe_bias_restore(GPT& m, const std::vector<float>& bias, ops::Stream s) {
  const size_t want = m.moe ? m.moe->bias.size() : 0;
  if (want == 0 || bias.empty()) return;  // not balancing by bias, or none kept yet: zeros
  CHECK(bias.size() == want, "resume: the checkpoint holds %zu MoE balancing biases, this run "
        "([train] moe_balance) needs %zu", bias.size(), want);
  m.moe->bias = bias;
  ops::copy_to_device_async(m.moe->bias_device, bias.data(), bias.size() * sizeof(float), s);
}
