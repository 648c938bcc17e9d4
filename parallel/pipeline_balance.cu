// parallel/pipeline_balance.cu - stage balancing (parallel/pipeline_balance.h): the estimated
// cost of each part of a training step, and the split of the blocks into pipeline stages that
// minimises the slowest stage.
//
// Why. Equal stages hold equal block counts, but the first stage also runs the embedding and
// the last the head and the loss: for a 50k-vocabulary GPT-2 124M the head's logits GEMM alone
// (6 V C FLOPs per token) is worth 4.9 blocks (6 x 12 C^2 + 6 C T each), and the loss reads and
// writes the logits several times. The slowest stage sets the pace of the whole pipeline (every
// micro-batch passes through it), so moving a block or two off the last stage shortens the step.
//
// The estimate, per micro-batch of B x T tokens on one rank:
//   FLOPs: 6 x (parameters a token uses) + 6 C T per block (attention), as the planner and MFU
//          count them (training/metrics.h), at [plan] peak_tflops x matmul_efficiency;
//   bytes: the embedding reads a wte and a wpe row per token and writes the activation, and its
//          backward scatters fp32 gradients (3 C e + C e + 16 C bytes per token); the loss
//          passes over the (tokens x Vp) logits five times (the GEMM writes them, softmax reads
//          them, writes their gradient, the two backward GEMMs read it), at [plan] hbm_gbs.
// The block's GEMMs are FLOP-bound and counted by FLOPs only.
//
// The split. With S stages and L blocks, best[s][l] = the least possible slowest time of the
// first l blocks in s stages = min over k of max(best[s-1][k], time of blocks k..l-1 as stage
// s-1), the embedding added to stage 0 and the head to stage S-1. O(S L^2), exact. Many splits
// share that slowest time when the ends are costly (the others need not be even), so a second
// pass picks, among the splits whose every stage is within it, the one with the least sum of
// squared stage times: the most even.
//
// With v > 1 chunks per rank this balances the stages, not the ranks: a rank's pace is the sum of
// its v chunks, and which stages share a rank depends on the order (loop: s, s+p, ...; V: r and
// 2p-1-r, both ends of the model on rank 0). GPT-2 124M at pp = 4, v = 2 gets blocks
// 1,1,1,2,2,2,2,1: interleaved, rank 3 holds stages 3 and 7, three blocks and the head, where
// two and the head would do. Balancing ranks couples stages far apart in model order (no longer
// this one-dimensional DP); not done: set pp_layers for such layouts.
#include "parallel/pipeline_balance.h"

#include <algorithm>
#include <cstdio>
#include <limits>

#include "config/device_peaks.h"

StageFlops pipeline_part_flops(const ModelConfig& m) {
  const double C = m.d_model, T = m.seq_len, Vp = m.padded_vocab();
  const double maxT = m.max_seq_len > 0 ? m.max_seq_len : m.seq_len;
  StageFlops f;
  f.embed = 6.0 * (maxT * C);         // wpe (llm.c counts it; the lookups do no GEMM)
  f.head = 6.0 * (Vp * C + 2 * C);  // the tied wte as the output layer, and ln_f
  double attention = 4 * C * C + 4 * C + 4 * C;  // qkv, proj with biases; two LayerNorms
  if (m.is_llama()) {  // no wpe; qkv with n_kv_head k and v heads, no biases; two RMSNorms
    f.embed = 0;
    attention = C * (m.n_head + 2.0 * m.kv_heads()) * m.head_dim() + C * C + 2 * C;
  }
  for (int l = 0; l < m.n_layer; l++) {
    double mlp = 8 * C * C + 5 * C;  // fc and proj with biases
    if (m.is_llama()) mlp = 3 * C * m.ffn_hidden();  // gate, up, down
    if (m.is_moe(l)) {  // the router, top_k of the experts (Llama's: gate, up, down), the shared
      const double D = m.expert_hidden();
      mlp = m.n_experts * C +
            m.top_k * (m.is_llama() ? 3 * C * D : 2 * C * D + D + C);
      const double S = m.shared_hidden();  // the shared experts: one MLP every token runs
      if (S > 0) mlp += m.is_llama() ? 3 * C * S : 2 * C * S + S + C;
    }
    f.block.push_back(6.0 * (attention + mlp) + 6.0 * C * T);
  }
  return f;
}

StageCosts pipeline_part_costs(const Config& cfg) {
  const ModelConfig& m = cfg.model;
  const PlanConfig& plan = cfg.plan;
  const double tokens = (double)cfg.train.micro_batch * m.seq_len;
  const double flop_ms = 1e3 / (plan_peak_tflops(cfg) * 1e12 * plan.matmul_efficiency);
  const double byte_ms = 1e3 / (plan.hbm_gbs * 1e9);
  const double e = cfg.precision.compute == "fp32" ? 4 : 2, C = m.d_model;
  const StageFlops f = pipeline_part_flops(m);
  StageCosts c;
  c.embed = tokens * (f.embed * flop_ms + (4 * C * e + 16 * C) * byte_ms);
  c.head = tokens * (f.head * flop_ms + 5.0 * m.padded_vocab() * e * byte_ms);
  for (double b : f.block) c.block.push_back(tokens * b * flop_ms);
  return c;
}

std::vector<double> pipeline_stage_times(const StageCosts& costs, const std::vector<int>& layers) {
  std::vector<double> t;
  int l = 0;
  for (size_t s = 0; s < layers.size(); s++) {
    double sum = s == 0 ? costs.embed : 0;
    for (int k = 0; k < layers[s]; k++) sum += costs.block[l++];
    if (s + 1 == layers.size()) sum += costs.head;
    t.push_back(sum);
  }
  return t;
}

// The DP of the top of the file: with `limit` < inf, the least sum of squares among the splits
// whose stages are all within limit; else the least slowest stage. Fills cut, returns the value.
static double split_dp(const StageCosts& costs, int S, double limit,
                       std::vector<std::vector<int>>& cut) {
  const int L = (int)costs.block.size();
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<double> prefix(L + 1, 0.0);
  for (int l = 0; l < L; l++) prefix[l + 1] = prefix[l] + costs.block[l];
  auto span = [&](int s, int k, int l) {  // blocks k..l-1 as stage s
    return prefix[l] - prefix[k] + (s == 0 ? costs.embed : 0) + (s == S - 1 ? costs.head : 0);
  };
  auto value = [&](double t) { return limit < inf ? (t <= limit ? t * t : inf) : t; };
  auto combine = [&](double a, double b) { return limit < inf ? a + b : std::max(a, b); };
  // best[s][l]: the first l blocks in stages 0..s; cut[s][l]: where stage s starts then.
  std::vector<std::vector<double>> best(S, std::vector<double>(L + 1, inf));
  cut.assign(S, std::vector<int>(L + 1, 0));
  for (int l = 1; l <= L; l++) best[0][l] = value(span(0, 0, l));
  for (int s = 1; s < S; s++)
    for (int l = s + 1; l <= L; l++)
      for (int k = s; k < l; k++) {
        const double t = combine(best[s - 1][k], value(span(s, k, l)));
        if (t < best[s][l]) best[s][l] = t, cut[s][l] = k;
      }
  return best[S - 1][L];
}

std::vector<int> pipeline_balance(const StageCosts& costs, int S) {
  const int L = (int)costs.block.size();
  std::vector<std::vector<int>> cut;
  const double slowest = split_dp(costs, S, std::numeric_limits<double>::infinity(), cut);
  split_dp(costs, S, slowest * (1 + 1e-12), cut);  // the most even of those as fast
  std::vector<int> layers(S);
  for (int s = S - 1, l = L; s >= 0; s--) {
    const int k = s == 0 ? 0 : cut[s][l];
    layers[s] = l - k;
    l = k;
  }
  return layers;
}

std::vector<int> pipeline_stage_layers(const Config& cfg) {
  const ParallelConfig& p = cfg.parallel;
  const int S = p.pp * p.pp_virtual;
  if (!p.pp_layers.empty()) return p.pp_layers;
  if (p.pp_balance == "auto" && S > 1) return pipeline_balance(pipeline_part_costs(cfg), S);
  return std::vector<int>(S, cfg.model.n_layer / S);
}

std::string pipeline_stage_summary(const StageCosts& costs, const std::vector<int>& layers) {
  const std::vector<double> t = pipeline_stage_times(costs, layers);
  double total = 0;
  for (double x : t) total += x;
  std::string blocks, share;
  for (size_t s = 0; s < t.size(); s++) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%s%d", s ? "," : "", layers[s]);
    blocks += buf;
    std::snprintf(buf, sizeof(buf), " %.0f%%", 100 * t[s] / total);
    share += buf;
  }
  return "blocks " + blocks + ", estimated share" + share;
}
