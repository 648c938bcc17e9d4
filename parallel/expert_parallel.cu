// parallel/expert_parallel.cu - expert parallelism: E experts spread over the ep ranks of a group,
// tokens moved to their experts and back with two all-to-alls per direction.
//
// The idea. An MoE layer has E expert MLPs and each token uses top_k of them (model/moe.cu).
// The experts are most of an MoE model's weights but each token touches few, so instead of
// replicating them, ep ranks each hold E/ep experts and the tokens travel: rank r holds experts
// [r*E/ep, (r+1)*E/ep). The ep ranks sit inside dp x cp (parallel/mesh.h): they run the same
// layers on different tokens, which is what lets one rank's experts serve everyone's tokens.
// The rest of the model (attention, router, LayerNorms) stays data parallel.
//
// Who sends what to whom. Each rank routes its own N tokens: N*top_k (token, slot) pairs, each
// bound for one expert. Sorted by expert (a stable counting sort: parallel/expert_dispatch_plan.cu)
// the pairs for rank j are one contiguous run, so one all-to-all-v moves them all: rank i sends
// rank j the rows of its pairs for j's experts, and receives from every rank the rows for its
// own. The experts run (one GEMM per expert, on all the rows it received, from every source),
// and a second all-to-all-v sends each output row back to the rank that owns the token, where
// the combine weighs it with its gate. The backward makes the same two trips with gradients.
//
//   rank 0 (experts 0,1)           rank 1 (experts 2,3)
//   tokens -> pairs sorted:        tokens -> pairs sorted:
//   [e0 e0 e1 | e2 e3 e3]          [e1 | e2 e2 e3]
//        \_______  ________/            /
//         all-to-all-v (dispatch): rank 0 keeps [e0 e0 e1], gets [e1] from rank 1, ...
//   received, source-major:        regrouped, expert-major (one GEMM per expert):
//   [e0 e0 e1 | e1]          ->    [e0 e0 | e1 e1]       experts: fc, gelu, proj
//   ... and back: ungroup to source-major, all-to-all-v (combine), gate-weighted sum at home.
//
// Why the counts go first. The layer is dropless by default: every token reaches its experts,
// however unbalanced the router is (with [train] moe_capacity_factor the pairs over an expert's
// capacity are dropped before the plan, model/moe.cu, and simply travel nowhere). So a receiver cannot know how many rows arrive until the senders
// say so: before the payload, the ranks exchange their per-expert counts (an all-to-all of E/ep
// ints to each peer, on the host, where the router's choices already are). From them each rank
// knows its receive counts, the rows of each of its experts, and where in the received buffer
// each expert's rows from each source lie. Buffers are sized for the worst case (every rank's
// tokens choosing this rank: ExpertParallel::max_expert_rows), so nothing is reallocated.
//
// Bytes per MoE layer and micro-batch, per rank, with N tokens of C channels in b-byte dtype:
//   counts    E ints (4E bytes)
//   dispatch  N*top_k*C*b sent in all (those to itself included; they never leave the rank)
//   combine   M*C*b back, M the rows this rank's experts ran (what it received in the dispatch:
//             routing-dependent per rank, the same as the dispatch summed over the group)
//   the backward repeats both trips (4 payload all-to-alls in all; the comm counters count the
//   send side, so per rank 2*(N*top_k + M)*C*b bytes and 4E for the counts)
// With a balanced router a fraction (ep-1)/ep of the rows leaves the rank. Imbalance shows up as
// uneven receive counts: the busiest rank's expert GEMMs set the pace of the whole group (the
// load-balancing loss in model/moe.cu pushes the router towards even counts; the trainer logs
// tokens per expert so a user can see it).
//
// Timeline of one MoE layer's forward (the all-to-alls are synchronous with compute here):
//   compute | router | plan (host) |        | regroup | experts | ungroup |         | combine
//   comm    |        | counts      | a2a-v  |                              | a2a-v   |
//
// Gradients. Expert weights are held by ep-rank blocks of the dp x cp ranks: the ranks with the
// same ep rank (Axis::EPDP, dp*cp/ep of them) hold the same experts and sum their gradients
// (DDP) or shard them (FSDP); that is the expert unit's grad axis in model/gpt.cu. Every rank's
// tokens already reached the experts in the forward, so nothing else is summed.
//
// ep = 1 is data parallel MoE: the dispatch order is expert-major already, so both trips are the
// identity. ep_trip_buffer gives the two sides of a trip the same buffer then, trip_rows sizes
// the scratch at zero, and ep_to_experts / ep_to_home return at once: no copy, no collective, not
// a byte more than the layer needs, and the model calls the trips unconditionally.
#include "parallel/expert_parallel.h"

#include <algorithm>

int ExpertParallel::max_expert_rows(int N) const {
  return size() * N * std::min(top_k, experts_per_rank());
}

int ExpertParallel::trip_rows(int N) const { return size() > 1 ? max_expert_rows(N) : 0; }

void* ep_trip_buffer(const ExpertParallel& ep, void* own, void* other) {
  return ep.size() > 1 ? own : other;
}

void ep_route_create(ExpertRoute& r, const ExpertParallel& ep, int N, Allocator& memory) {
  const size_t pairs = (size_t)N * ep.top_k, rows = ep.trip_rows(N);
  int** arrays[] = {&r.token_of_row, &r.position, &r.regroup, &r.ungroup};
  const size_t counts[] = {pairs, pairs, rows, rows};
  for (int i = 0; i < 4; i++) *arrays[i] = (int*)allocate(memory, counts[i] * sizeof(int));
}

// The counts exchange: from[s*per + j] = rows that rank s sends to local expert j (with one
// rank, its own counts). From them: the rows each local expert runs, where they start in the
// expert-major buffer, and the rows that arrive from each rank.
static void exchange_counts(ExpertRoute& r, ExpertParallel& ep) {
  const int per = ep.experts_per_rank();
  r.from.assign((size_t)ep.size() * per, 0);
  all_to_all_host(*ep.group, r.plan.expert_counts.data(), per, r.from.data());
  r.expert_rows.assign(per, 0);
  r.recv_counts.assign(ep.size(), 0);
  for (int s = 0; s < ep.size(); s++)
    for (int j = 0; j < per; j++) {
      r.expert_rows[j] += r.from[s * per + j];
      r.recv_counts[s] += r.from[s * per + j];
    }
  r.expert_first.assign(per, 0);
  for (int j = 1; j < per; j++) r.expert_first[j] = r.expert_first[j - 1] + r.expert_rows[j - 1];
  r.M = r.expert_first[per - 1] + r.expert_rows[per - 1];
}

// The two gathers between the received (source-major) order and the expert-major order the
// GEMMs want (ep > 1; with one rank the two orders are the same).
static void regroup_indices(const ExpertRoute& r, const ExpertParallel& ep,
                            std::vector<int>& regroup, std::vector<int>& ungroup) {
  const int per = ep.experts_per_rank();
  regroup.assign(r.M, 0);
  ungroup.assign(r.M, 0);
  std::vector<int> next(r.expert_first);  // the next free expert-major row of each expert
  int received = 0;                       // rows in received order: source s, then expert j
  for (int s = 0; s < ep.size(); s++)
    for (int j = 0; j < per; j++)
      for (int i = 0; i < r.from[s * per + j]; i++, received++) {
        regroup[next[j]] = received;
        ungroup[received] = next[j]++;
      }
}

void ep_route(ExpertRoute& r, ExpertParallel& ep, const int* expert, int N, ops::Stream s) {
  r.plan = expert_dispatch_plan_build(expert, N, ep.top_k, ep.E, ep.size());
  const int pairs = N * ep.top_k, kept = r.plan.kept;  // kept < pairs: the capacity dropped some
  std::vector<int> token_of_row(kept);
  for (int i = 0; i < kept; i++) token_of_row[i] = r.plan.order[i] / ep.top_k;
  ops::copy_to_device_async(r.token_of_row, token_of_row.data(), kept * sizeof(int), s);
  ops::copy_to_device_async(r.position, r.plan.position.data(), pairs * sizeof(int), s);
  r.send_counts.assign(r.plan.rank_send_counts.begin(), r.plan.rank_send_counts.end());
  exchange_counts(r, ep);
  if (ep.size() == 1) return;  // every expert is here, in dispatch order: nothing to regroup
  std::vector<int> regroup, ungroup;
  regroup_indices(r, ep, regroup, ungroup);
  ops::copy_to_device_async(r.regroup, regroup.data(), r.M * sizeof(int), s);
  ops::copy_to_device_async(r.ungroup, ungroup.data(), r.M * sizeof(int), s);
}

// Row counts -> element counts of C channels.
static std::vector<size_t> elements(const std::vector<size_t>& rows, int C) {
  std::vector<size_t> out(rows);
  for (size_t& x : out) x *= (size_t)C;
  return out;
}

// One rank: the rows are where they belong already (the same buffer), or one copy away.
static void stay_home(const ExpertRoute& r, void* dst, const void* src, int C, DType dt,
                      ops::Stream s) {
  if (dst != src) ops::copy_on_device(dst, src, (size_t)r.M * C * dtype_size(dt), s);
}

void ep_to_experts(ExpertParallel& ep, const ExpertRoute& r, const void* rows, void* expert_major,
                   void* recv, int C, DType dt, ops::Stream s) {
  if (ep.size() == 1) return stay_home(r, expert_major, rows, C, dt, s);
  const std::vector<size_t> send = elements(r.send_counts, C), got = elements(r.recv_counts, C);
  all_to_all_v(*ep.group, rows, send.data(), recv, got.data(), dt, s);
  ops::moe_permute(expert_major, recv, r.regroup, r.M, C, dt, s);
}

void ep_to_home(ExpertParallel& ep, const ExpertRoute& r, const void* expert_major, void* rows,
                void* send, int C, DType dt, ops::Stream s) {
  if (ep.size() == 1) return stay_home(r, rows, expert_major, C, dt, s);
  ops::moe_permute(send, expert_major, r.ungroup, r.M, C, dt, s);
  const std::vector<size_t> out = elements(r.recv_counts, C), back = elements(r.send_counts, C);
  all_to_all_v(*ep.group, send, out.data(), rows, back.data(), dt, s);
}
