// parallel/context_parallel_plan.cu - the ring-attention plan with zigzag chunks (the rules are
// listed in parallel/context_parallel_plan.h). No communication and no kernels: the executor
// that sends K and V around the cp group and calls the attention kernels on these blocks is
// parallel/context_parallel.cu; this file decides who computes which block at which ring step.
//
// The idea. Context parallelism splits the sequence over cp ranks. Everything in a transformer
// block is per token except attention, where every query needs the keys and values of all earlier
// tokens. Ring attention gets them without ever holding the whole sequence: the ranks form a ring,
// each computes attention of its own queries against the K, V it holds, then passes those K, V
// to the next rank and receives the previous rank's; after cp steps every query has met every key.
// The transfer of step s+1 overlaps with the compute of step s.
//
// The merge. Each block gives, for every query row, a partial output o_b (softmax over that
// block's keys only) and its log-sum-exp l_b = log sum_j exp(s_j). Two partial results over
// disjoint key sets combine exactly:
//   l = log(exp(l_1) + exp(l_2)),   o = o_1 exp(l_1 - l) + o_2 exp(l_2 - l)
// (ops::attention_merge, computed stably). So a rank keeps one running (o, l) per query row and
// merges each block into it; no (T, T) matrix and no full sequence ever exists. The backward
// replays the ring with the final l (each block's probabilities are exp(s - l)), accumulating dQ
// locally while dK and dV travel with their K and V and come home after the last step.
//
// Why zigzag. With a causal mask, chunk q attends to chunks 0..q: later chunks have more work.
// With one contiguous piece per rank, the last rank does cp times the work of the first and the
// ring's pace is set by it. Zigzag gives rank r an early chunk r and its mirror 2cp-1-r, so every
// rank's two chunks attend to (r + 1/2) + (2cp-1-r + 1/2) = 2cp full blocks' worth: the same
// for every rank. The ring spreads it evenly over the steps, too:
//   step 0:  two causal blocks on the diagonal + one full block     = 2 full blocks
//            (exactly: c(c+1)/2 * 2 + c^2 = 2c^2 + c scored pairs, with c = T/(2cp))
//   step s:  two full blocks (see the rules in the header)           = 2 full blocks (2c^2 pairs)
// Every rank does the same work at every step, counted either way, so no rank waits for another
// at a step boundary. The total, cp * (2c^2 + c + (cp-1) 2c^2) scored pairs, is the causal
// triangle's T(T+1)/2 exactly: nothing is computed twice, nothing above the diagonal.
//
// The cost. Per step each rank sends K and V of its two chunks, 2 * 2 * c * C elements per
// sequence, to its ring neighbour: (cp - 1) transfers per layer forward (step 0 is local). The
// backward sends K and V again and also dK and dV, which need one more hop home: cp transfers of
// the gradients (cp_bytes). The compute per step is 2 c^2 * C multiply-adds for the scores
// (and the same for the output), so the transfer hides behind it when c is large enough:
// bandwidth * 2 c^2 C * (flops per second)^-1 > 4 c C bytes, i.e. c grows the compute faster.
//
// cp = 2 (chunks 0..3; rank 0 holds {0, 3}, rank 1 holds {1, 2}). Query chunks are rows, key and
// value chunks columns; each cell says which rank computes the block at which step, "\" marks a
// causal block:
//
//            kv 0    kv 1    kv 2    kv 3
//   q 0     r0s0\     .       .       .
//   q 1     r1s1    r1s0\     .       .
//   q 2     r1s1    r1s0    r1s0\     .
//   q 3     r0s0    r0s1    r0s1    r0s0\  (q 3 x kv 3: causal)
//
//   rank 0, step 0: its own K, V {0, 3}:        (0,0) causal, (3,0) full, (3,3) causal
//   rank 0, step 1: K, V of rank 1 = {1, 2}:    (3,1) full, (3,2) full
//   rank 1, step 0: its own K, V {1, 2}:        (1,1) causal, (2,1) full, (2,2) causal
//   rank 1, step 1: K, V of rank 0 = {0, 3}:    (1,0) full, (2,0) full
// Each rank: 2 full blocks' worth at step 0 and at step 1.
#include "parallel/context_parallel_plan.h"

#include <cstdio>

#include "kernels/common.h"

const char* cp_mask_name(CpMask m) { return m == CpMask::Causal ? "causal" : "full"; }

std::string cp_plan_validate(int cp, int T) {
  std::string msg;
  auto add = [&](const std::string& line) { msg += (msg.empty() ? "" : "\n") + line; };
  const std::string cps = std::to_string(cp), Ts = std::to_string(T);
  if (cp < 1) add("context parallel: cp = " + cps + " must be at least 1");
  if (T < 1) add("context parallel: the sequence length T = " + Ts + " must be at least 1");
  if (cp >= 1 && T >= 1 && T % (2 * cp) != 0)
    add("context parallel: T = " + Ts + " is not a multiple of 2*cp = " + std::to_string(2 * cp) +
        " (the sequence is cut into 2*cp chunks of equal size, two per rank)");
  return msg;
}

void cp_local_chunks(int cp, int r, int* first, int* second) {
  *first = r;
  *second = 2 * cp - 1 - r;
}

std::vector<int> cp_positions(int cp, int T, int r) {
  const int c = T / (2 * cp);
  int first, second;
  cp_local_chunks(cp, r, &first, &second);
  std::vector<int> pos;
  pos.reserve(2 * (size_t)c);
  for (int chunk : {first, second})
    for (int i = 0; i < c; ++i) pos.push_back(chunk * c + i);
  return pos;
}

// Rank r at ring step s (the rules in the header).
static CpStep make_step(int cp, int r, int s) {
  CpStep step;
  step.kv_rank = ((r - s) % cp + cp) % cp;
  int q1, q2, j, j2;  // the local query chunks, and the received key/value chunks
  cp_local_chunks(cp, r, &q1, &q2);
  cp_local_chunks(cp, step.kv_rank, &j, &j2);
  if (s == 0) {
    step.blocks = {{q1, q1, CpMask::Causal}, {q2, q1, CpMask::Full}, {q2, q2, CpMask::Causal}};
  } else if (s <= r) {
    step.blocks = {{q1, j, CpMask::Full}, {q2, j, CpMask::Full}};
  } else {
    step.blocks = {{q2, j, CpMask::Full}, {q2, j2, CpMask::Full}};
  }
  return step;
}

ContextParallelPlan cp_plan_build(int cp, int T) {
  const std::string err = cp_plan_validate(cp, T);
  CHECK(err.empty(), "%s", err.c_str());
  ContextParallelPlan plan;
  plan.cp = cp, plan.T = T, plan.chunk = T / (2 * cp);
  plan.ranks.resize(cp);
  for (int r = 0; r < cp; ++r)
    for (int s = 0; s < cp; ++s) plan.ranks[r].push_back(make_step(cp, r, s));
  return plan;
}

double cp_step_work(const CpStep& step) {
  double work = 0;
  for (const CpBlock& b : step.blocks) work += b.mask == CpMask::Causal ? 0.5 : 1.0;
  return work;
}

CpBytes cp_bytes(int cp, int B, int T, int C, size_t kv_bytes, size_t grad_bytes) {
  const size_t elems = (size_t)2 * 2 * (T / (2 * cp)) * (size_t)C * (size_t)B;  // K,V x 2 chunks
  CpBytes bytes;
  bytes.step = elems * kv_bytes;
  bytes.forward = (size_t)(cp - 1) * bytes.step;
  bytes.backward = (size_t)(cp - 1) * bytes.step + (cp > 1 ? (size_t)cp * elems * grad_bytes : 0);
  return bytes;
}

std::string cp_plan_dump(const ContextParallelPlan& plan) {
  std::string out;
  char buf[128];
  for (int r = 0; r < plan.cp; ++r)
    for (int s = 0; s < plan.cp; ++s)
      for (const CpBlock& b : plan.ranks[r][s].blocks) {
        std::snprintf(buf, sizeof(buf), "block %d %d %d %d %d %s\n", r, s,
                      plan.ranks[r][s].kv_rank, b.q_chunk, b.kv_chunk, cp_mask_name(b.mask));
        out += buf;
      }
  for (int r = 0; r < plan.cp; ++r) {
    out += "positions " + std::to_string(r);
    for (int p : cp_positions(plan.cp, plan.T, r)) out += " " + std::to_string(p);
    out += "\n";
  }
  return out;
}

std::string cp_plan_picture(const ContextParallelPlan& plan) {
  const int n = 2 * plan.cp;
  std::vector<std::string> cell((size_t)n * n, ".");
  for (int r = 0; r < plan.cp; ++r)
    for (int s = 0; s < plan.cp; ++s)
      for (const CpBlock& b : plan.ranks[r][s].blocks)
        cell[(size_t)b.q_chunk * n + b.kv_chunk] = "r" + std::to_string(r) + "s" +
            std::to_string(s) + (b.mask == CpMask::Causal ? "\\" : "");
  std::string out = "       ";
  char buf[32];
  for (int k = 0; k < n; ++k) {
    std::snprintf(buf, sizeof(buf), " kv %-4d", k);
    out += buf;
  }
  out += "\n";
  for (int q = 0; q < n; ++q) {
    std::snprintf(buf, sizeof(buf), "  q %-3d", q);
    out += buf;
    for (int k = 0; k < n; ++k) {
      std::snprintf(buf, sizeof(buf), " %-7s", cell[(size_t)q * n + k].c_str());
      out += buf;
    }
    out += "\n";
  }
  return out;
}
