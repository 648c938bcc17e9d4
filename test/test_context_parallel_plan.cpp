// test/test_context_parallel_plan.cpp - checks parallel/context_parallel_plan.* (pure logic, one
// process).
//
// For cp in 1..8 and chunk sizes c in {1, 3, 8} (T = 2*cp*c), the plan cp_plan_build makes:
//  - shape: cp ranks, cp steps each; at step s rank r holds the K, V of rank (r - s) mod cp; every
//    block's query chunk is one of rank r's two chunks and its kv chunk one of the held rank's;
//  - coverage by chunks: every (q chunk, kv chunk) pair with kv <= q is computed exactly once over
//    all ranks and steps, with the causal mask exactly when q == kv and full otherwise; no pair
//    with kv > q appears;
//  - coverage by tokens (T <= 96): expanding each block into its (query position, key position)
//    pairs with its mask, every pair with key <= query appears exactly once and no other;
//  - balance: the property asserted is "at every step, every rank does the same work", in two
//    counts: (a) blocks, a causal block counting 1/2: exactly 2 per rank per step; (b) the exact
//    number of scored (query, key) pairs: 2c^2 + c at step 0 and 2c^2 at every later step, on
//    every rank. Why it holds: step 0 is two causal blocks and one full block on every rank,
//    every later step two full blocks (the rules in context_parallel_plan.h);
//  - positions: the ranks' local positions together are a permutation of 0..T-1, and each rank's
//    are increasing (so one causal attention over the local tokens is the step-0 blocks);
//  - the refused (cp, T), and the bytes of cp_bytes against the formula;
//  - the checks above catch a broken plan: a block dropped, a mask flipped, a block duplicated, a
//    block above the diagonal, a block moved to another rank's step (unbalanced).
// Prints one line per check ("ok ..." or "FAIL ...") and the cp = 2 and cp = 4 pictures; exits 1 on
// any failure. With "--dump cp T" it prints cp_plan_dump(cp_plan_build(cp, T)) instead (read by
// test/test_ring_attention.py).
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "parallel/context_parallel_plan.h"
#include "test/check_results.h"

namespace {

// Ranks, steps, kv_rank, and each block's chunks belong to the right ranks.
bool shape_ok(const ContextParallelPlan& p) {
  if ((int)p.ranks.size() != p.cp || p.chunk * 2 * p.cp != p.T) return false;
  for (int r = 0; r < p.cp; ++r) {
    if ((int)p.ranks[r].size() != p.cp) return false;
    for (int s = 0; s < p.cp; ++s) {
      const CpStep& st = p.ranks[r][s];
      const int j = ((r - s) % p.cp + p.cp) % p.cp;
      if (st.kv_rank != j) return false;
      for (const CpBlock& b : st.blocks) {
        if (b.q_chunk != r && b.q_chunk != 2 * p.cp - 1 - r) return false;
        if (b.kv_chunk != j && b.kv_chunk != 2 * p.cp - 1 - j) return false;
      }
    }
  }
  return true;
}

// Every chunk pair kv <= q exactly once, causal exactly on the diagonal, nothing above it.
bool chunk_coverage_ok(const ContextParallelPlan& p) {
  const int n = 2 * p.cp;
  std::map<std::pair<int, int>, int> count;
  for (const auto& steps : p.ranks)
    for (const CpStep& st : steps)
      for (const CpBlock& b : st.blocks) {
        if (b.kv_chunk > b.q_chunk) return false;
        if ((b.mask == CpMask::Causal) != (b.q_chunk == b.kv_chunk)) return false;
        count[{b.q_chunk, b.kv_chunk}]++;
      }
  for (int q = 0; q < n; ++q)
    for (int k = 0; k <= q; ++k)
      if (count[{q, k}] != 1) return false;
  return (int)count.size() == n * (n + 1) / 2;
}

// The same at token level: every (query position, key position) with key <= query exactly once.
bool token_coverage_ok(const ContextParallelPlan& p) {
  const int c = p.chunk;
  std::vector<int> seen((size_t)p.T * p.T, 0);
  for (const auto& steps : p.ranks)
    for (const CpStep& st : steps)
      for (const CpBlock& b : st.blocks)
        for (int i = 0; i < c; ++i)
          for (int k = 0; k < c; ++k) {
            if (b.mask == CpMask::Causal && k > i) continue;
            seen[(size_t)(b.q_chunk * c + i) * p.T + b.kv_chunk * c + k]++;
          }
  for (int q = 0; q < p.T; ++q)
    for (int k = 0; k < p.T; ++k)
      if (seen[(size_t)q * p.T + k] != (k <= q ? 1 : 0)) return false;
  return true;
}

long long step_pairs(const CpStep& st, int c) {
  long long pairs = 0;
  for (const CpBlock& b : st.blocks)
    pairs += b.mask == CpMask::Causal ? (long long)c * (c + 1) / 2 : (long long)c * c;
  return pairs;
}

// Every rank at every step: work 2 blocks, and 2c^2 + c (step 0) or 2c^2 scored pairs.
bool balance_ok(const ContextParallelPlan& p) {
  const long long c = p.chunk;
  for (const auto& steps : p.ranks)
    for (int s = 0; s < p.cp; ++s) {
      if (cp_step_work(steps[s]) != 2.0) return false;
      if (step_pairs(steps[s], p.chunk) != 2 * c * c + (s == 0 ? c : 0)) return false;
    }
  return true;
}

bool positions_ok(int cp, int T) {
  std::vector<int> hits(T, 0);
  for (int r = 0; r < cp; ++r) {
    const std::vector<int> pos = cp_positions(cp, T, r);
    if ((int)pos.size() != T / cp) return false;
    for (size_t i = 0; i < pos.size(); ++i) {
      if (pos[i] < 0 || pos[i] >= T) return false;
      if (i > 0 && pos[i] <= pos[i - 1]) return false;
      hits[pos[i]]++;
    }
  }
  for (int h : hits)
    if (h != 1) return false;
  return true;
}

bool plan_ok(const ContextParallelPlan& p) {
  return shape_ok(p) && chunk_coverage_ok(p) && (p.T > 96 || token_coverage_ok(p)) &&
         balance_ok(p);
}

void check_plans(Results& res) {
  for (int cp = 1; cp <= 8; ++cp)
    for (int c : {1, 3, 8}) {
      const int T = 2 * cp * c;
      const ContextParallelPlan p = cp_plan_build(cp, T);
      res.check(shape_ok(p), "cp=%d T=%d shape: ranks, steps, kv_rank, chunk ownership", cp, T);
      res.check(chunk_coverage_ok(p), "cp=%d T=%d every chunk pair kv<=q once, causal on the "
                "diagonal only, none above", cp, T);
      if (T <= 96)
        res.check(token_coverage_ok(p), "cp=%d T=%d every token pair key<=query once", cp, T);
      res.check(balance_ok(p), "cp=%d T=%d balance: 2 blocks and 2c^2(+c at step 0) pairs per "
                "rank per step", cp, T);
      res.check(positions_ok(cp, T), "cp=%d T=%d positions: a permutation of 0..T-1, increasing "
                "per rank", cp, T);
    }
}

void check_refusals(Results& res) {
  res.check(cp_plan_validate(2, 8).empty(), "cp=2 T=8 accepted");
  res.check(cp_plan_validate(4, 8).empty(), "cp=4 T=8 accepted (chunks of 1 token)");
  const std::string a = cp_plan_validate(2, 6), b = cp_plan_validate(0, 8),
                    c = cp_plan_validate(1, 0);
  res.check(a.find("not a multiple of 2*cp = 4") != std::string::npos, "cp=2 T=6 refused: %s",
            a.c_str());
  res.check(b.find("cp = 0") != std::string::npos, "cp=0 refused: %s", b.c_str());
  res.check(c.find("T = 0") != std::string::npos, "T=0 refused: %s", c.c_str());
}

void check_bytes(Results& res) {
  // cp = 4, B = 2, T = 64 (c = 8), C = 16, bf16 K/V, fp32 gradients.
  const CpBytes b = cp_bytes(4, 2, 64, 16, 2, 4);
  const size_t elems = 2 * 2 * 8 * 16 * 2;
  res.check(b.step == elems * 2 && b.forward == 3 * elems * 2 &&
                b.backward == 3 * elems * 2 + 4 * elems * 4,
            "cp_bytes cp=4 B=2 T=64 C=16: step %zu, forward %zu, backward %zu", b.step, b.forward,
            b.backward);
  const CpBytes one = cp_bytes(1, 2, 64, 16, 2, 4);
  res.check(one.forward == 0 && one.backward == 0, "cp_bytes cp=1: nothing crosses the ring");
}

// A broken plan must fail the checks: one mutation each.
void check_detection(Results& res) {
  const ContextParallelPlan good = cp_plan_build(3, 18);
  res.check(plan_ok(good), "cp=3 T=18 unbroken plan passes every check");
  ContextParallelPlan p = good;
  p.ranks[1][1].blocks.pop_back();
  res.check(!plan_ok(p), "a dropped block is caught");
  p = good;
  p.ranks[0][0].blocks[1].mask = CpMask::Causal;
  res.check(!plan_ok(p), "a flipped mask is caught");
  p = good;
  p.ranks[2][2].blocks.push_back(p.ranks[2][2].blocks[0]);
  res.check(!plan_ok(p), "a duplicated block is caught");
  p = good;
  std::swap(p.ranks[1][2].blocks[0].q_chunk, p.ranks[1][2].blocks[0].kv_chunk);
  res.check(!plan_ok(p), "a block above the diagonal is caught");
  p = good;  // rank 2's step-2 block moved to rank 2's step 1: coverage intact, balance broken
  p.ranks[2][1].blocks.push_back(p.ranks[2][2].blocks.back());
  p.ranks[2][2].blocks.pop_back();
  res.check(!balance_ok(p) && chunk_coverage_ok(p), "an unbalanced step is caught (coverage "
            "alone would pass)");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 4 && std::strcmp(argv[1], "--dump") == 0) {
    const int cp = std::atoi(argv[2]), T = std::atoi(argv[3]);
    const std::string err = cp_plan_validate(cp, T);
    if (!err.empty()) {
      std::fprintf(stderr, "%s\n", err.c_str());
      return 1;
    }
    std::fputs(cp_plan_dump(cp_plan_build(cp, T)).c_str(), stdout);
    return 0;
  }
  Results res;
  check_plans(res);
  check_refusals(res);
  check_bytes(res);
  check_detection(res);
  for (int cp : {2, 4}) {
    std::printf("\nblocks of cp=%d (rank r, step s; \\ = causal):\n", cp);
    std::fputs(cp_plan_picture(cp_plan_build(cp, 4 * cp)).c_str(), stdout);
  }
  std::printf("\n%d checks, %d failures\n", res.checks, res.failures);
  return res.exit_status();
}
