// parallel/expert_parallel.h - expert parallelism: moving each token to the ranks that hold its
// experts and the experts' outputs back. The idea, the bytes and a diagram are at the top of
// parallel/expert_parallel.cu; the MoE layer that uses this is model/moe.cu.
//
// One MoE layer and one micro-batch, on one rank of an ep group:
//   ep_route            the router's choices (host) -> an ExpertRoute: the dispatch plan of this
//                       rank's (token, slot) pairs, the token counts exchanged with the group,
//                       and the index arrays the row gathers need, uploaded to the device
//   ep_to_experts       pair rows in dispatch order (this rank's pairs, sorted by expert) ->
//                       the rows this rank's experts run, expert-major (one GEMM per expert)
//   ep_to_home          the reverse: the experts' rows -> this rank's pairs, dispatch order
// The backward uses the same two moves on gradients (to_experts for d(expert output), to_home
// for d(expert input)). With ep = 1 the dispatch order already is expert-major and both moves
// are the identity: a caller that lets ep_trip_buffer pick its buffers hands them the same
// buffer on both sides, and nothing is copied or sent. So no caller branches on ep.
#pragma once
#include <vector>

#include "kernels/allocator.h"
#include "kernels/ops.h"
#include "parallel/comm.h"
#include "parallel/expert_dispatch_plan.h"

struct ExpertParallel {
  Comm* group = nullptr;  // the ep group (its ranks hold different experts, the same layers)
  int E = 0, top_k = 0;
  int size() const { return group->size; }
  int rank() const { return group->rank; }
  int experts_per_rank() const { return E / size(); }
  // The most rows this rank's experts can receive in one micro-batch of N tokens: every rank's
  // N tokens, each sending at most min(top_k, E/ep) of its pairs here (dropless: buffers are
  // sized for it, nothing is ever dropped).
  int max_expert_rows(int N) const;
  // The rows of each scratch buffer the trips pass through (sent, received, the experts' output
  // and its gradient before they travel home): max_expert_rows, or 0 with one rank, where
  // nothing travels.
  int trip_rows(int N) const;
};

// Where every pair of one layer and micro-batch goes, on both sides of the all-to-all.
struct ExpertRoute {
  ExpertDispatchPlan plan;         // this rank's N*top_k pairs (host)
  std::vector<int> from;           // (size x E/ep) rows source rank s sends to local expert j
  std::vector<int> expert_rows;    // (E/ep) rows local expert j runs: the sum over sources
  std::vector<int> expert_first;   // (E/ep) its first row in the expert-major buffer
  std::vector<size_t> send_counts, recv_counts;  // (size) rows to / from each rank
  int M = 0;                       // rows at this rank's experts (sum of expert_rows)
  // Device index arrays (int32), written by ep_route:
  int* token_of_row = nullptr;     // (N*top_k) dispatch row i holds the token of pair order[i]
  int* position = nullptr;         // (N*top_k) the plan's inverse: pair p's dispatch row
  int* regroup = nullptr;          // (max rows) expert-major row i <- received row regroup[i]
  int* ungroup = nullptr;          // (max rows) received-order row i <- expert-major row ungroup[i]
};

// A route's device arrays for micro-batches of up to N tokens, from `memory` (which owns them; a
// count-only allocator, the planner's, only counts them).
void ep_route_create(ExpertRoute& r, const ExpertParallel& ep, int N, Allocator& memory);
// Builds the route of N tokens from the router's choices expert (N x top_k, host): the plan, the
// counts exchange over the ep group (a host all-to-all of E/ep ints per peer: the receivers
// must know their row counts before the rows arrive), the gather indices, uploaded on s.
void ep_route(ExpertRoute& r, ExpertParallel& ep, const int* expert, int N, ops::Stream s);
// The buffer one side of a trip keeps its rows in: `own` with ep > 1; with one rank both sides
// hold the same rows in the same order, so the other side's buffer `other`, and the trip between
// them moves nothing.
void* ep_trip_buffer(const ExpertParallel& ep, void* own, void* other);
// rows (N*top_k x C, dispatch order) -> expert_major (r.M x C). recv: scratch of trip_rows x C.
// One rank: the identity (rows == expert_major: nothing to do; else one copy).
void ep_to_experts(ExpertParallel& ep, const ExpertRoute& r, const void* rows, void* expert_major,
                   void* recv, int C, DType dt, ops::Stream s);
// expert_major (r.M x C) -> rows (N*top_k x C, dispatch order). send: scratch of trip_rows x C.
// One rank: the identity, as above.
void ep_to_home(ExpertParallel& ep, const ExpertRoute& r, const void* expert_major, void* rows,
                void* send, int C, DType dt, ops::Stream s);
