// parallel/expert_dispatch_plan.cu - expert parallelism's dispatch plan (what it holds is in
// parallel/expert_dispatch_plan.h). Host code only (compiled as C++; no device code).
//
// How: a counting sort of the N*top_k (token, slot) pairs by expert, which is stable by
// construction. One pass counts the pairs of each expert; a prefix sum turns the counts into each
// expert's first row (expert_offsets); a second pass, in pair order, puts every pair at its
// expert's next free row, so the pairs of one expert keep their token order. O(N*top_k + E) time,
// no comparisons. The rank counts are sums of the consecutive experts each rank holds, and the
// inverse permutation is one more pass. Deterministic: a pure function of its inputs. A pair the
// capacity dropped (expert kDroppedPair) is skipped by every pass: it gets no row.
#include "parallel/expert_dispatch_plan.h"

#include <cstdio>

#include "kernels/common.h"

std::string expert_dispatch_validate(int N, int top_k, int E, int ep) {
  std::string err;
  char line[160];
  auto fail = [&](const char* fmt, int a, int b) {
    std::snprintf(line, sizeof(line), fmt, a, b);
    err += line;
  };
  if (N < 0) fail("expert dispatch: N = %d tokens must be >= 0 (%d)\n", N, 0);
  if (top_k < 1 || top_k > E)
    fail("expert dispatch: top_k = %d must be in [1, E = %d]\n", top_k, E);
  if (ep < 1)
    fail("expert dispatch: ep = %d ranks must be >= 1 (E = %d)\n", ep, E);
  else if (E % ep != 0)
    fail("expert dispatch: E = %d experts must split evenly over ep = %d ranks\n", E, ep);
  return err;
}

// expert_counts and expert_offsets from the chosen experts (one counting pass, one prefix sum).
static void count_experts(ExpertDispatchPlan& p, const int* expert) {
  const int pairs = p.N * p.top_k;
  p.expert_counts.assign(p.E, 0);
  for (int i = 0; i < pairs; i++) {
    if (expert[i] == kDroppedPair) continue;
    if (expert[i] < 0 || expert[i] >= p.E)
      FATAL("expert dispatch: pair %d (token %d, slot %d) routed to expert %d, not in [0, %d)", i,
            i / p.top_k, i % p.top_k, expert[i], p.E);
    p.expert_counts[expert[i]]++;
  }
  p.expert_offsets.assign(p.E + 1, 0);
  for (int e = 0; e < p.E; e++) p.expert_offsets[e + 1] = p.expert_offsets[e] + p.expert_counts[e];
}

ExpertDispatchPlan expert_dispatch_plan_build(const int* expert, int N, int top_k, int E, int ep) {
  const std::string err = expert_dispatch_validate(N, top_k, E, ep);
  if (!err.empty()) FATAL("%s", err.c_str());
  ExpertDispatchPlan p;
  p.N = N, p.top_k = top_k, p.E = E, p.ep = ep, p.experts_per_rank = E / ep;
  count_experts(p, expert);
  const int pairs = N * top_k;
  p.kept = p.expert_offsets[E];
  p.order.assign(p.kept, -1);
  p.position.assign(pairs, -1);  // a dropped pair keeps -1
  std::vector<int> next(p.expert_offsets.begin(), p.expert_offsets.end() - 1);  // free row
  for (int i = 0; i < pairs; i++)  // pair order: stable
    if (expert[i] != kDroppedPair) p.order[next[expert[i]]++] = i;
  for (int row = 0; row < p.kept; row++) p.position[p.order[row]] = row;
  p.rank_send_counts.assign(ep, 0);
  p.rank_offsets.assign(ep + 1, 0);
  for (int r = 0; r < ep; r++) {
    for (int e = r * p.experts_per_rank; e < (r + 1) * p.experts_per_rank; e++)
      p.rank_send_counts[r] += p.expert_counts[e];
    p.rank_offsets[r + 1] = p.rank_offsets[r] + p.rank_send_counts[r];
  }
  return p;
}
