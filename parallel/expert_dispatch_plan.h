// parallel/expert_dispatch_plan.h - expert parallelism's dispatch, as data: from the experts the
// router chose (moe_router_forward's expert (N, top_k), kernels/ops_decls.h) and ep ranks that
// hold E/ep experts each, in which order the (token, slot) pairs go to the experts, how many go
// to each expert and to each rank, and how to put the experts' outputs back. Pure logic: no
// communication, no model, no kernels. How it is computed is explained at the top of
// parallel/expert_dispatch_plan.cu.
//
// Pairs. Slot j of token n is the pair p = n * top_k + j, routed to expert expert[p]. Expert e
// lives on rank e / (E / ep) (rank r holds experts r*E/ep .. (r+1)*E/ep - 1).
//
// Expert order. order (N*top_k) lists the pairs sorted by expert, stably: within one expert the
// pairs keep their token order. The i-th row of the dispatch buffer is pair order[i]; expert e's
// rows are [expert_offsets[e], expert_offsets[e+1]). Because a rank's experts are consecutive,
// rank r's rows are one contiguous range too, [rank_offsets[r], rank_offsets[r+1]), of
// rank_send_counts[r] rows: the send counts and displacements of an all-to-all-v.
//
// Combine. position is the inverse permutation: pair p sits in row position[p] of the dispatch
// buffer, so token n's output is sum_j gate[n, j] * expert_out[position[n * top_k + j]].
//
// Dropped pairs. A pair whose expert is kDroppedPair (the capacity factor dropped it, model/moe.cu)
// goes nowhere: it has no row (order lists the `kept` others), position[p] = -1, and no expert
// counts it. Without drops kept = N*top_k and the plan is the dropless one.
#pragma once

#include <string>
#include <vector>

constexpr int kDroppedPair = -1;  // the "expert" of a dropped pair

struct ExpertDispatchPlan {
  int N = 0, top_k = 0, E = 0, ep = 1;
  int kept = 0;                       // pairs with an expert (N*top_k less the dropped)
  int experts_per_rank = 0;           // E / ep
  std::vector<int> order;             // (kept) row i of the dispatch buffer holds pair order[i]
  std::vector<int> position;          // (N*top_k) the inverse: position[order[i]] == i; -1: dropped
  std::vector<int> expert_counts;     // (E) pairs routed to each expert
  std::vector<int> expert_offsets;    // (E+1) prefix sums of expert_counts, from 0
  std::vector<int> rank_send_counts;  // (ep) pairs routed to each rank's experts
  std::vector<int> rank_offsets;      // (ep+1) prefix sums of rank_send_counts, from 0
};

// "" if (N, top_k, E, ep) can be planned, else one line per broken rule: N >= 0,
// 1 <= top_k <= E, ep >= 1, E % ep == 0.
std::string expert_dispatch_validate(int N, int top_k, int E, int ep);

// The plan for expert (N, top_k), host memory; stops the job (FATAL) on what
// expert_dispatch_validate refuses or on an expert id outside [0, E).
ExpertDispatchPlan expert_dispatch_plan_build(const int* expert, int N, int top_k, int E, int ep);
