// test/test_expert_dispatch_plan.cpp - checks parallel/expert_dispatch_plan.* (pure logic, one
// process).
//
// Cases: E = 8 over ep = 1, 2, 4, 8; E = 12 over ep = 3; E = 13 over ep = 1 and 13; top_k = 1, 2,
// 3; N = 0, 1, 37 and 1000 tokens. Each token picks top_k distinct random experts (as the router
// does), from a skewed distribution so that some experts (and on small N whole ranks) get none.
// For every plan, against a brute-force recount:
//  - order is a permutation of the N*top_k pairs and position is its inverse;
//  - expert order: the experts of order[] never decrease, and within one expert the pairs are in
//    increasing pair (so token) order: the sort is stable;
//  - expert_counts and rank_send_counts equal the brute-force counts; the offsets are their prefix
//    sums; every row in a rank's range [rank_offsets[r], rank_offsets[r+1]) goes to an expert of
//    rank r, and every row in an expert's range to that expert;
//  - combine round trip: gathering token ids into the dispatch buffer and reading them back
//    through position gives every pair its own token;
//  - expert_dispatch_validate refuses E % ep != 0, top_k > E, top_k < 1, ep < 1, N < 0.
// And the checks catch a broken plan: two rows of one expert swapped (not stable), two rows of
// different experts swapped (not in expert order), a count off by one, position not the inverse.
// Prints one line per check ("ok ..." or "FAIL ..."); exits 1 on any failure.
#include <algorithm>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "parallel/expert_dispatch_plan.h"
#include "test/check_results.h"

namespace {

// top_k distinct experts per token, drawn with weights 1, 1/2, 1/3, ... (a skewed load).
std::vector<int> random_experts(std::mt19937& rng, int N, int top_k, int E) {
  std::vector<double> w(E);
  for (int e = 0; e < E; e++) w[e] = 1.0 / (e + 1);
  std::vector<int> out;
  for (int n = 0; n < N; n++) {
    std::vector<double> left = w;
    for (int j = 0; j < top_k; j++) {
      std::discrete_distribution<int> pick(left.begin(), left.end());
      const int e = pick(rng);
      out.push_back(e);
      left[e] = 0.0;
    }
  }
  return out;
}

// Every property of the header against a brute-force recount; "" when all hold, else the first
// broken one.
std::string plan_problem(const ExpertDispatchPlan& p, const std::vector<int>& expert) {
  const int pairs = p.N * p.top_k, epr = p.experts_per_rank;
  if ((int)p.order.size() != pairs || (int)p.position.size() != pairs) return "sizes";
  std::vector<int> seen(pairs, 0);
  for (int i = 0; i < pairs; i++) {
    if (p.order[i] < 0 || p.order[i] >= pairs || seen[p.order[i]]++)
      return "order not a permutation";
    if (p.position[p.order[i]] != i) return "position not the inverse of order";
  }
  for (int i = 1; i < pairs; i++) {
    const int a = expert[p.order[i - 1]], b = expert[p.order[i]];
    if (a > b) return "not in expert order";
    if (a == b && p.order[i - 1] > p.order[i]) return "not stable within an expert";
  }
  std::vector<int> ecount(p.E, 0), rcount(p.ep, 0);
  for (int e : expert) ecount[e]++, rcount[e / epr]++;
  if (p.expert_counts != ecount) return "expert_counts";
  if (p.rank_send_counts != rcount) return "rank_send_counts";
  for (int e = 0; e < p.E; e++) {
    if (p.expert_offsets[e + 1] - p.expert_offsets[e] != ecount[e]) return "expert_offsets";
    for (int i = p.expert_offsets[e]; i < p.expert_offsets[e + 1]; i++)
      if (expert[p.order[i]] != e) return "a row outside its expert's range";
  }
  for (int r = 0; r < p.ep; r++) {
    if (p.rank_offsets[r + 1] - p.rank_offsets[r] != rcount[r]) return "rank_offsets";
    for (int i = p.rank_offsets[r]; i < p.rank_offsets[r + 1]; i++)
      if (expert[p.order[i]] / epr != r) return "a row outside its rank's range";
  }
  if (p.expert_offsets[0] != 0 || p.rank_offsets[0] != 0) return "offsets do not start at 0";
  return "";
}

// Combine round trip: dispatch buffer row i holds the token of pair order[i]; reading pair q back
// through position[q] must give token q / top_k.
bool round_trip_ok(const ExpertDispatchPlan& p) {
  const int pairs = p.N * p.top_k;
  std::vector<int> buffer(pairs);
  for (int i = 0; i < pairs; i++) buffer[i] = p.order[i] / p.top_k;
  for (int q = 0; q < pairs; q++)
    if (buffer[p.position[q]] != q / p.top_k) return false;
  return true;
}

void check_plans(Results& res) {
  std::mt19937 rng(1234);
  const std::pair<int, int> layouts[] = {{8, 1},  {8, 2},  {8, 4}, {8, 8},
                                         {12, 3}, {13, 1}, {13, 13}};
  for (const auto& [E, ep] : layouts)
    for (int top_k : {1, 2, 3})
      for (int N : {0, 1, 37, 1000}) {
        const std::vector<int> expert = random_experts(rng, N, top_k, E);
        const ExpertDispatchPlan p = expert_dispatch_plan_build(expert.data(), N, top_k, E, ep);
        const std::string problem = plan_problem(p, expert);
        res.check(problem.empty() && round_trip_ok(p), "E=%d ep=%d top_k=%d N=%d: plan%s%s", E,
                  ep, top_k, N, problem.empty() ? "" : ": ", problem.c_str());
      }
}

void check_refusals(Results& res) {
  res.check(expert_dispatch_validate(37, 2, 8, 4).empty(), "accepts N=37 top_k=2 E=8 ep=4");
  res.check(!expert_dispatch_validate(37, 2, 8, 3).empty(), "refuses E=8 over ep=3");
  res.check(!expert_dispatch_validate(37, 9, 8, 1).empty(), "refuses top_k=9 > E=8");
  res.check(!expert_dispatch_validate(37, 0, 8, 1).empty(), "refuses top_k=0");
  res.check(!expert_dispatch_validate(37, 2, 8, 0).empty(), "refuses ep=0");
  res.check(!expert_dispatch_validate(-1, 2, 8, 1).empty(), "refuses N=-1");
}

// Broken plans must be caught by plan_problem.
void check_detection(Results& res) {
  std::mt19937 rng(99);
  const int N = 37, top_k = 2, E = 8, ep = 2;
  const std::vector<int> expert = random_experts(rng, N, top_k, E);
  const ExpertDispatchPlan good = expert_dispatch_plan_build(expert.data(), N, top_k, E, ep);
  auto fix_position = [](ExpertDispatchPlan& p) {
    for (int i = 0; i < (int)p.order.size(); i++) p.position[p.order[i]] = i;
  };
  ExpertDispatchPlan p = good;
  res.check(good.expert_counts[0] >= 2, "the detection case has two rows of expert 0");
  std::swap(p.order[0], p.order[1]);
  fix_position(p);
  res.check(!plan_problem(p, expert).empty(), "catches two rows of one expert swapped");
  p = good;
  std::swap(p.order[0], p.order.back());
  fix_position(p);
  res.check(!plan_problem(p, expert).empty(), "catches rows of two experts swapped");
  p = good;
  p.expert_counts[1]++;
  res.check(!plan_problem(p, expert).empty(), "catches an expert count off by one");
  p = good;
  p.rank_send_counts[0]--;
  res.check(!plan_problem(p, expert).empty(), "catches a rank count off by one");
  p = good;
  std::swap(p.position[0], p.position[1]);
  res.check(!plan_problem(p, expert).empty(), "catches position not the inverse");
}

}  // namespace

int main() {
  Results res;
  res.verbose = true;
  check_plans(res);
  check_refusals(res);
  check_detection(res);
  std::printf("\n%d checks, %d failures\n", res.checks, res.failures);
  return res.exit_status();
}
