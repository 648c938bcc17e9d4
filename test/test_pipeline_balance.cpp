// test/test_pipeline_balance.cpp - checks parallel/pipeline_balance.h: the stage costs and the
// split of the blocks into pipeline stages (pure arithmetic, one process).
//  - the parts' FLOPs per token sum to the planner's and MFU's count, 6 x (the parameters a
//    token uses) + 6 L C T (training/metrics.h, computed here from the model shape
//    independently), dense and with experts;
//  - pipeline_balance against brute force over every split (fresh random costs, awkward L and S:
//    7 blocks in 3 stages, 11 in 4, 9 in 9...): the same slowest-stage time, and among the
//    splits that fast the same least sum of squared stage times;
//  - GPT-2 124M (V = 50257) at pp = 4: "auto" moves blocks off the last stage (the head's
//    logits GEMM is worth about five blocks; the first stage's embedding is a lookup, cheap, so
//    the first stage keeps its L/pp) and its slowest stage is faster than the equal split's;
//    with an expensive embedding too, blocks leave both ends; with the embedding and the head
//    free, the equal split is optimal and "auto" keeps it;
//  - pipeline_stage_layers: pp_layers as given, "auto", or equal; pipeline_stage_summary.
// Exits 1 on any failure.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "parallel/pipeline_balance.h"
#include "test/check_results.h"

namespace {

double slowest(const StageCosts& c, const std::vector<int>& layers) {
  const std::vector<double> t = pipeline_stage_times(c, layers);
  return *std::max_element(t.begin(), t.end());
}

double squares(const StageCosts& c, const std::vector<int>& layers) {
  double sum = 0;
  for (double t : pipeline_stage_times(c, layers)) sum += t * t;
  return sum;
}

// Every split of L blocks into S non-empty stages: the best slowest time, and the least sum of
// squares among the splits within 1e-9 of it.
std::pair<double, double> brute_force(const StageCosts& c, int S) {
  const int L = (int)c.block.size();
  std::vector<std::vector<int>> all;
  std::vector<int> layers(S, 1);
  std::function<void(int, int)> go = [&](int s, int left) {
    if (s == S - 1) {
      layers[s] = left;
      all.push_back(layers);
      return;
    }
    for (int n = 1; n <= left - (S - 1 - s); n++) layers[s] = n, go(s + 1, left - n);
  };
  go(0, L);
  double best = 1e300, even = 1e300;
  for (const std::vector<int>& x : all) best = std::min(best, slowest(c, x));
  for (const std::vector<int>& x : all)
    if (slowest(c, x) <= best * (1 + 1e-9)) even = std::min(even, squares(c, x));
  return {best, even};
}

ModelConfig gpt2_124m() {
  ModelConfig m;
  m.n_layer = 12, m.n_head = 12, m.d_model = 768, m.seq_len = 1024, m.vocab_size = 50257;
  return m;
}

void check_flops(Results& res) {
  for (bool moe : {false, true}) {
    ModelConfig m = gpt2_124m();
    if (moe) m.n_experts = 8, m.top_k = 2, m.moe_every = 2, m.d_expert = 1000;
    const StageFlops f = pipeline_part_flops(m);
    double sum = f.embed + f.head;
    for (double b : f.block) sum += b;
    // The planner's count, from the shape: the root, then every block's parameters a token uses.
    const double C = m.d_model, T = m.seq_len, Vp = m.padded_vocab(), maxT = m.seq_len;
    double active = Vp * C + maxT * C + 2 * C;
    for (int l = 0; l < m.n_layer; l++) {
      active += 12 * C * C + 13 * C;  // a dense block: qkv, proj, fc, fc proj, two LayerNorms
      if (m.is_moe(l))  // the MLP swapped for the router and top_k experts
        active += -(8 * C * C + 5 * C) + m.n_experts * C +
                  m.top_k * (2 * C * m.d_expert + m.d_expert + C);
    }
    const double want = 6 * active + 6 * m.n_layer * C * T;
    res.check(std::fabs(sum - want) <= 1e-12 * want, "%s: the parts' FLOPs per token sum to %.6g, "
              "6 N_active + 6 L C T = %.6g", moe ? "with experts" : "dense", sum, want);
  }
}

void check_against_brute_force(Results& res) {
  std::mt19937_64 rng(std::random_device{}());
  std::uniform_real_distribution<double> u(0.5, 2.0);
  const int cases[][2] = {{7, 3}, {11, 4}, {9, 9}, {10, 2}, {13, 5}, {6, 1}};
  for (const auto& c : cases) {
    StageCosts costs;
    for (int l = 0; l < c[0]; l++) costs.block.push_back(u(rng));
    costs.embed = 3 * u(rng), costs.head = 5 * u(rng);
    const std::vector<int> layers = pipeline_balance(costs, c[1]);
    int sum = 0;
    for (int n : layers) sum += n;
    const bool valid = (int)layers.size() == c[1] && sum == c[0] &&
                       *std::min_element(layers.begin(), layers.end()) >= 1;
    const double got = slowest(costs, layers), even = squares(costs, layers);
    const auto [want, want_even] = brute_force(costs, c[1]);
    res.check(valid && got == want && std::fabs(even - want_even) <= 1e-12 * want_even,
              "L=%d S=%d random costs: slowest stage %.6f, sum of squares %.6f; brute force over "
              "every split %.6f, %.6f", c[0], c[1], got, even, want, want_even);
  }
}

void check_gpt2(Results& res) {
  Config cfg;
  cfg.model = gpt2_124m();
  cfg.train.micro_batch = 4;
  cfg.precision.compute = "bf16";
  cfg.parallel.pp = 4;
  const StageCosts costs = pipeline_part_costs(cfg);
  const std::vector<int> equal(4, 3), layers = pipeline_balance(costs, 4);
  const double t_auto = slowest(costs, layers), t_equal = slowest(costs, equal);
  res.check(layers.front() <= 3 && layers.back() < 3 && t_auto < t_equal,
            "GPT-2 124M, pp = 4: auto %s; slowest stage %.3f ms, equal stages (%s) %.3f ms",
            pipeline_stage_summary(costs, layers).c_str(), t_auto,
            pipeline_stage_summary(costs, equal).c_str(), t_equal);
  StageCosts both = costs;  // an embedding as costly as the head
  both.embed = costs.head;
  const std::vector<int> ends = pipeline_balance(both, 4);
  res.check(ends.front() < 3 && ends.back() < 3 && slowest(both, ends) < slowest(both, equal),
            "with an embedding as costly as the head: %s",
            pipeline_stage_summary(both, ends).c_str());
  StageCosts free_ends = costs;
  free_ends.embed = free_ends.head = 0;
  const std::vector<int> plain = pipeline_balance(free_ends, 4);
  res.check(plain == equal, "the same without embedding and head costs: %s (equal)",
            pipeline_stage_summary(free_ends, plain).c_str());
  cfg.parallel.pp_balance = "auto";
  res.check(pipeline_stage_layers(cfg) == layers, "pp_balance = \"auto\": the same split");
  cfg.parallel.pp_balance = "equal";
  res.check(pipeline_stage_layers(cfg) == equal, "pp_balance = \"equal\": 3,3,3,3");
  cfg.parallel.pp_layers = {2, 4, 4, 2};
  res.check(pipeline_stage_layers(cfg) == cfg.parallel.pp_layers, "pp_layers: as given");
}

}  // namespace

int main() {
  Results res;
  check_flops(res);
  check_against_brute_force(res);
  check_gpt2(res);
  std::printf("\ntest_pipeline_balance: %d of %d checks failed\n", res.failures, res.checks);
  return res.exit_status();
}
