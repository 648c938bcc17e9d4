// parallel/context_parallel_plan.h - ring attention with zigzag load balance, as data: for cp
// context-parallel ranks and a sequence of T tokens, which tokens each rank holds, their global
// positions, and for each ring step which (query chunk, key/value chunk) blocks of the causal
// attention each rank computes and with which mask. Pure logic: no communication, no model, no
// kernels. The idea, the merge and the cost are explained at the top of
// parallel/context_parallel_plan.cu.
//
// Chunks. The sequence is cut into 2*cp chunks of T/(2*cp) tokens, numbered 0..2cp-1 in sequence
// order. Rank r holds chunks r and 2cp-1-r, in that order: its local sequence is chunk r followed
// by chunk 2cp-1-r (T/cp tokens), so local token i of rank r has the global position
// cp_positions(cp, T, r)[i], which is what wpe must be indexed with.
//
// The ring. At step s = 0..cp-1 rank r holds the K and V of rank (r - s) mod cp (its own at step
// 0), then passes them on to rank r+1 and receives the next ones from rank r-1. Blocks of step s
// on rank r (q = query chunk, kv = key/value chunk, both global chunk ids):
//   s = 0:       {r, r, causal}, {2cp-1-r, r, full}, {2cp-1-r, 2cp-1-r, causal}
//                which is exactly one causal attention over the two local chunks placed at their
//                global positions: the first local chunk attends causally to itself, the second
//                attends fully to the first (all of chunk r precedes it) and causally to itself.
//   1 <= s <= r: j = r - s < r:   {r, j, full}, {2cp-1-r, j, full}
//                (both local query chunks x the first received chunk; the second received chunk
//                2cp-1-j lies after both local chunks: nothing to do)
//   s > r:       j = r - s + cp > r:   {2cp-1-r, j, full}, {2cp-1-r, 2cp-1-j, full}
//                (the second local query chunk x both received chunks; the first local chunk r
//                precedes both received chunks: nothing to do)
// A causal block (q == kv) masks key position > query position inside the chunk; a full block
// masks nothing. Blocks are listed in the order given, the order in which the outputs of one
// query chunk are merged (attention_merge, kernels/ops_decls.h).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

enum class CpMask : int {
  Causal = 0,  // q_chunk == kv_chunk: query i attends to keys 0..i of the same chunk
  Full = 1,    // kv_chunk < q_chunk: every query attends to every key of the block
};
const char* cp_mask_name(CpMask m);  // "causal" or "full"

// One block of attention: the queries of chunk q_chunk against the keys and values of chunk
// kv_chunk (global chunk ids).
struct CpBlock {
  int q_chunk;
  int kv_chunk;
  CpMask mask;
};

// One ring step of one rank: the rank whose K and V it holds, and the blocks it computes.
struct CpStep {
  int kv_rank;
  std::vector<CpBlock> blocks;
};

struct ContextParallelPlan {
  int cp = 1, T = 0;
  int chunk = 0;                             // tokens per chunk: T / (2*cp)
  std::vector<std::vector<CpStep>> ranks;    // ranks[r][s]: rank r at ring step s (cp steps)
};

// "" if (cp, T) can be planned, else one line per broken rule: cp >= 1, T >= 1,
// T % (2*cp) == 0 (2*cp chunks of equal size).
std::string cp_plan_validate(int cp, int T);

// The plan; stops the job (FATAL) on what cp_plan_validate refuses.
ContextParallelPlan cp_plan_build(int cp, int T);

// The two global chunks of rank r, in local order: {r, 2cp-1-r}.
void cp_local_chunks(int cp, int r, int* first, int* second);

// The global position of each of rank r's T/cp local tokens, in local order:
// chunk r's positions, then chunk 2cp-1-r's.
std::vector<int> cp_positions(int cp, int T, int r);

// Work of one step, in units of one full block (chunk x chunk scores): a causal block counts 1/2
// (its diagonal is counted as half, the usual approximation: chunk*(chunk+1)/2 of chunk^2 pairs).
double cp_step_work(const CpStep& step);

// Bytes each rank sends (and receives) for one attention layer and B sequences, with K and V in
// elements of kv_bytes and the gradients dK, dV in elements of grad_bytes. C is the key (or value)
// channels that travel: kv heads * head size, which grouped-query attention makes n_head/n_kv_head
// times smaller than the query channels.
//   step:     K and V of one rank's 2 chunks: 2 (K, V) * 2 chunks * (T/(2cp)) * C * kv_bytes * B
//   forward:  (cp - 1) * step   (step 0 uses the rank's own K, V; each later step one transfer)
//   backward: the same (cp - 1) K, V transfers again, plus dK, dV travelling with them: every
//             rank adds its contribution to the dK, dV of the block it holds and passes them on;
//             after the last step they take one more hop home, so cp transfers of
//             2 * 2 * (T/(2cp)) * C * grad_bytes * B.
struct CpBytes {
  size_t step = 0, forward = 0, backward = 0;
};
CpBytes cp_bytes(int cp, int B, int T, int C, size_t kv_bytes, size_t grad_bytes);

// The plan as text: one line per block, "block <rank> <step> <kv_rank> <q_chunk> <kv_chunk>
// <mask>", then one line per rank "positions <rank> p0 p1 ...". Read by test/test_ring_attention.py.
std::string cp_plan_dump(const ContextParallelPlan& plan);

// ASCII picture of the causal (query chunk x kv chunk) triangle, each cell "r<rank>s<step>" and a
// trailing "\" on causal blocks, "." above the diagonal. One line per query chunk.
std::string cp_plan_picture(const ContextParallelPlan& plan);
