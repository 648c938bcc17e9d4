// model/moe_balance.h - the MoE layer's host bookkeeping that model/moe.cu calls in its forward
// (model/moe_balance.cu). The step's report and the balancing biases are model/moe.h's.
#pragma once
#include <vector>

#include "model/moe.h"

// The balance loss of one layer and micro-batch: counts per (sequence, expert) over every rank
// holding part of the sequences, then the gradient of the balance term w.r.t. p for each local
// token (a.balance_grad). Returns this rank's share of the term's value (summed over all ranks:
// the term's value for the micro-batch). expert: the router's choices (Nt x top_k, host).
double moe_balance(GPT& m, MoeActs& a, const std::vector<int>& expert,
                   const std::vector<float>& probs, int B, int T, float dloss_scale);
// [train] moe_capacity_factor: marks this rank's pairs over their expert's capacity
// kDroppedPair in `expert` (the rule at the top of model/moe.cu; collective over the tp group
// with sequence parallelism and the cp group). Returns the pairs dropped here.
double moe_drop_over_capacity(GPT& m, std::vector<int>& expert, int B, int T);
