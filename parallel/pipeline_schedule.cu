// parallel/pipeline_schedule.cu - pipeline schedules as data: the builder that writes, for p
// pipeline ranks, m micro-batches and v model chunks per rank, the ordered list of actions each
// rank performs in one step (gpipe, 1f1b, interleaved 1f1b). No communication and no model.
// parallel/pipeline.cu runs these lists; pipeline_simulator.cu runs them against each other (and
// checks them); pipeline_messages.cu moves their sends and receives to where they cannot stall. docs/PARALLELISM.md ("The pipeline schedules") derives the bubble
// and the warm-ups, and explains why the messages go where they go.
//
// The idea. Pipeline parallelism cuts the model into stages, one per rank, and the batch into m
// micro-batches. Micro-batch i flows forward through stages 0, 1, ..., p-1 (each stage sending its
// output activation to the next) and its gradient flows back through p-1, ..., 0. A stage can
// only work on micro-batch i after its neighbour did, so at the start and at the end of every
// step some ranks wait: the pipeline bubble, (p - 1)/(v*m + p - 1) of the step with equal stages
// and free communication (pipeline_bubble; v = 1 except for interleaved).
//
//   gpipe: every rank runs all m forwards, then all m backwards. Simple, but rank 0 holds the
//          activations of all m micro-batches at the peak: memory grows with m.
//   1f1b:  rank r runs w = min(p - r - 1, m) forwards (warm-up: just enough to fill the
//          pipeline below it), then alternates one forward and one backward (steady state),
//          then runs the backwards still owed (cool-down). A backward frees its micro-batch's
//          activations, so rank r never holds more than min(p - r, m) micro-batches: memory
//          is bounded by p, not m, and m can grow to shrink the bubble without costing memory.
//   interleaved (Megatron's interleaved 1f1b): each rank holds v smaller chunks instead of one
//          stage; chunk c of rank r is stage c*p + r of S = p*v stages, so a micro-batch visits
//          every rank v times. Micro-batches go through the chunks in groups of p (forward:
//          group 0 through chunk 0, then chunk 1, ..., then group 1; backward: chunks in reverse),
//          which needs m % p == 0. Warm-up w = (p - r - 1) + (v - 1)p chunk forwards (capped at
//          m*v), then 1f1b on chunks. The pipeline fills v times faster (the bubble above), rank
//          r holds at most min(w + 1, m*v) chunks, p stages' worth of layers like 1f1b, and the
//          price is v times more boundary messages.
//
// Timelines, p = 4, m = 8, F = 1 (one column pair), B = 2 ("B3==": backward of micro-batch 3):
//
//   gpipe, 33 units, every rank holds 8 micro-batches at the peak
//   rank 0 |F0F1F2F3F4F5F6F7..................B0==B1==B2==B3==B4==B5==B6==B7==|
//   rank 1 |..F0F1F2F3F4F5F6F7............B0==B1==B2==B3==B4==B5==B6==B7==....|
//   rank 2 |....F0F1F2F3F4F5F6F7......B0==B1==B2==B3==B4==B5==B6==B7==........|
//   rank 3 |......F0F1F2F3F4F5F6F7B0==B1==B2==B3==B4==B5==B6==B7==............|
//
//   1f1b, 33 units, rank r holds at most 4 - r micro-batches
//   rank 0 |F0F1F2F3............B0==F4B1==F5B2==F6B3==F7B4==..B5==..B6==..B7==|
//   rank 1 |..F0F1F2........B0==F3B1==F4B2==F5B3==F6B4==F7B5==..B6==..B7==....|
//   rank 2 |....F0F1....B0==F2B1==F3B2==F4B3==F5B4==F6B5==F7B6==..B7==........|
//   rank 3 |......F0B0==F1B1==F2B2==F3B3==F4B4==F5B5==F6B6==F7B7==............|
//
//   interleaved, p = 4, m = 4, v = 2 (chunk 0 upper case, chunk 1 lower case), F = 1 and B = 2
//   per chunk, 33 units; 1f1b on the same model (F = 2, B = 4 per stage) would take 42
//   rank 0 |F0F1F2F3f0f1f2f3............b0==..b1==..b2==..b3==B0==B1==B2==B3==|
//   rank 1 |..F0F1F2F3f0f1f2........b0==f3b1==..b2==..b3==B0==B1==B2==B3==....|
//   rank 2 |....F0F1F2F3f0f1....b0==f2b1==f3b2==..b3==B0==B1==B2==B3==........|
//   rank 3 |......F0F1F2F3f0b0==f1b1==f2b2==f3b3==B0==B1==B2==B3==............|
//
// The lists. Each compute action is preceded by the receive of its input and followed by the
// send of its output, when the neighbouring stage is on another rank (stage s talks to s - 1 and
// s + 1: ranks r - 1 and r + 1, and rank p-1 to rank 0 between chunks when interleaved; per step
// m*(p*v - 1) messages each way, whose bytes parallel/pipeline.cu counts). In the steady state
// that gives F(i) send-fwd(i) recv-bwd(j) B(j) send-bwd(j) recv-fwd(i+1) F(i+1). The executor
// posts each run of consecutive sends and receives (pipeline_comm_runs) as one batched operation
// that returns when all of it is done. Sends and receives between two ranks must be posted in the
// same order on both ends (NCCL and MPI tag 0 match in posting order). At p = 2 the interleaved
// schedule would put activations and gradients on that one channel in different orders, hence
// its p >= 3 rule. pipeline_build ends by handing the lists to pipeline_place_messages.
#include "parallel/pipeline_schedule.h"

#include <algorithm>
#include <cstdio>

#include "kernels/common.h"

const char* pipe_op_name(PipeOp op) {
  static const char* names[] = {"F", "B", "send-fwd", "recv-fwd", "send-bwd", "recv-bwd"};
  return names[(int)op];
}

bool pipe_op_is_comm(PipeOp op) { return op != PipeOp::Forward && op != PipeOp::Backward; }
bool pipe_op_is_send(PipeOp op) { return op == PipeOp::SendForward || op == PipeOp::SendBackward; }

// ---------------------------------------------------------------------------------------------
// Building (the rules a schedule obeys are config/layout_rules.cu's pipeline_rules, checked when
// the config is read)
// ---------------------------------------------------------------------------------------------
int pipeline_warmup(const std::string& kind, int p, int m, int v, int rank) {
  const int total = m * v;
  if (kind == "gpipe") return total;
  if (kind == "1f1b") return std::min(p - rank - 1, m);
  return std::min((p - rank - 1) + (v - 1) * p, total);
}

double pipeline_bubble(int p, int m, int v) { return (double)(p - 1) / (v * m + p - 1); }

// The k-th forward (or backward) a rank runs: micro-batch and chunk. One chunk: micro-batches in
// order. Interleaved: groups of p micro-batches, each group through chunk 0, 1, ..., v-1 in the
// forward and v-1, ..., 0 in the backward, then the next group.
static PipeAction kth(const PipelineSchedule& s, int k, bool forward) {
  if (s.v == 1) return {forward ? PipeOp::Forward : PipeOp::Backward, k, 0, -1};
  const int group = k / (s.p * s.v), chunk = (k / s.p) % s.v;
  return {forward ? PipeOp::Forward : PipeOp::Backward, group * s.p + k % s.p,
          forward ? chunk : s.v - 1 - chunk, -1};
}

// A compute action with the communication around it: the receive of its input right before it,
// the send of its output right after it. None between two stages of the same rank (p = 1).
static void append(const PipelineSchedule& s, int r, const PipeAction& a,
                   std::vector<PipeAction>& out) {
  const int S = s.p * s.v, stage = a.chunk * s.p + r;
  const bool fwd = a.op == PipeOp::Forward;
  const int from = fwd ? stage - 1 : stage + 1;  // the stage this action's input comes from
  const int to = fwd ? stage + 1 : stage - 1;    // the stage its output goes to
  if (from >= 0 && from < S && from % s.p != r)
    out.push_back({fwd ? PipeOp::RecvForward : PipeOp::RecvBackward, a.micro, a.chunk, from % s.p});
  out.push_back(a);
  if (to >= 0 && to < S && to % s.p != r)
    out.push_back({fwd ? PipeOp::SendForward : PipeOp::SendBackward, a.micro, a.chunk, to % s.p});
}

// Every rank: w warm-up forwards, then one forward and one backward at a time (steady state), then
// the remaining backwards (cool-down). Then the messages move to where rendezvous needs them
// (parallel/pipeline_messages.cu).
PipelineSchedule pipeline_build(const std::string& kind, int p, int m, int v) {
  const std::string err = pipeline_rules(kind, p, m, v, 0);
  CHECK(err.empty(), "%s", err.c_str());
  PipelineSchedule s;
  s.kind = kind, s.p = p, s.m = m, s.v = v;
  s.ranks.resize(p);
  const int total = m * v;
  for (int r = 0; r < p; ++r) {
    const int w = pipeline_warmup(kind, p, m, v, r);
    std::vector<PipeAction>& out = s.ranks[r];
    for (int k = 0; k < w; ++k) append(s, r, kth(s, k, true), out);
    for (int k = 0; k < total - w; ++k) {
      append(s, r, kth(s, w + k, true), out);
      append(s, r, kth(s, k, false), out);
    }
    for (int k = total - w; k < total; ++k) append(s, r, kth(s, k, false), out);
  }
  if (p > 1) pipeline_place_messages(s);
  return s;
}

// The runs of sends and receives between computes: what the executor posts as one operation each.
std::vector<std::pair<size_t, size_t>> pipeline_comm_runs(const std::vector<PipeAction>& actions) {
  std::vector<std::pair<size_t, size_t>> runs;
  for (size_t i = 0; i < actions.size(); ++i) {
    if (!pipe_op_is_comm(actions[i].op)) continue;
    if (runs.empty() || runs.back().second != i) runs.push_back({i, i});
    runs.back().second = i + 1;
  }
  return runs;
}
