// parallel/pipeline_schedule.cu - pipeline schedules as data: the builder that writes, for p
// pipeline ranks, m micro-batches and v model chunks per rank, the ordered list of actions each
// rank performs in one step (gpipe, 1f1b, interleaved 1f1b, and the zero-bubble zb-h1 and
// zb-v), and the stage orders. No communication and no model. parallel/pipeline.cu runs these
// lists; pipeline_simulator.cu runs them against each other (and checks them);
// pipeline_messages.cu moves their sends and receives to where they cannot stall;
// pipeline_file.cu reads a user's. docs/PARALLELISM.md ("The pipeline schedules") derives the
// bubbles and explains why the messages go where they go.
//
// The idea. Pipeline parallelism cuts the model into stages, one per rank, and the batch into m
// micro-batches. Micro-batch i flows forward through stages 0, 1, ..., p-1 (each stage sending its
// output activation to the next) and its gradient flows back through p-1, ..., 0. A stage can
// only work on micro-batch i after its neighbour did, so at the start and at the end of every
// step some ranks wait: the pipeline bubble. The formulas below hold at the nominal costs, per
// chunk F = B = W = 1 (forward, the backward's input-gradient part, its weight-gradient part;
// an unsplit backward costs B + W = 2), and the simulator reproduces them exactly
// (test/test_pipeline_schedule.cpp).
//
//   gpipe: every rank runs all m forwards, then all m backwards. Simple, but rank 0 holds the
//          activations of all m micro-batches at the peak: memory grows with m.
//   1f1b:  rank r runs w = min(p - r - 1, m) forwards (warm-up: just enough to fill the
//          pipeline below it), then alternates one forward and one backward (steady state),
//          then runs the backwards still owed (cool-down). A backward frees its micro-batch's
//          activations, so rank r never holds more than min(p - r, m) micro-batches: memory
//          is bounded by p, not m. Bubble (p - 1)/(m + p - 1), like gpipe's.
//   interleaved (Megatron's interleaved 1f1b): each rank holds v smaller chunks instead of one
//          stage (Loop order: chunk c of rank r is stage c*p + r), so a micro-batch visits every
//          rank v times. Micro-batches go through the chunks in groups of p (forward: group 0
//          through chunk 0, then chunk 1, ..., then group 1; backward: chunks in reverse), which
//          needs m % p == 0. Warm-up w = (p - r - 1) + (v - 1)p chunk forwards (capped at m*v),
//          then 1f1b on chunks. Bubble (p - 1)/(v*m + p - 1), rank r holds at most
//          min(w + 1, m*v) chunks (p stages' worth of layers, like 1f1b), and the price is v
//          times more boundary messages.
//   zb-h1 (Qi et al., "Zero Bubble Pipeline Parallelism", 2023): 1f1b with each backward split
//          into B and W. Rank r runs 1f1b's warm-up and F/B alternation, but the W of a
//          micro-batch only r micro-batches after its B (W(k - r) after B(k), the rest at the
//          end). The B's then reach rank 0 at B's pace instead of (B + W)'s, and the deferred
//          W's fill the cool-down. Every rank holds min(p, m) micro-batches at the peak (1f1b's
//          rank 0: the same peak memory). Makespan max(3m + p - 1, 2m + 2p - 1): for m >= p the
//          bubble is p - 1 units, a third of 1f1b's 3(p - 1). At any costs and m >= p:
//          m(F + B + W) + (p - 1) max(F + B - W, F, B).
//   zb-v (the same paper's ZB-V): v = 2 chunks per rank in the V order (rank r holds stages r
//          and 2p-1-r: the micro-batch goes down the ranks and back up, so rank p-1 runs both of
//          its chunks back to back and the last stage sits on rank 0, which starts first).
//          Rank r: 2(p - r) - 1 forwards of chunk 0; r times a forward of chunk 1 and one of
//          chunk 0; p - r times F, B, W of chunk 1; then the steady state (F, B, W of chunk 0,
//          F, B, W of chunk 1) while forwards remain; then r times B of chunk 0 and B of chunk
//          1, p - r times B of chunk 0 and the oldest W of chunk 0, then the W's left (chunk 1's,
//          then chunk 0's). With m < 2p - 1 the lists are those of 2p - 1 micro-batches without
//          the extra ones. Rank r holds min(m + 1 + r, 2m, 2p) chunk activations (p stages'
//          worth, like 1f1b's rank 0), and the makespan is 6m + max(p - 1, 2(2p - 1 - m)): for
//          m >= 2p - 1 the bubble is p - 1 chunk units, a sixth of 1f1b's on the same model
//          (3(p - 1) stage units of 2 chunks). At any chunk costs with F <= B and W <= B and
//          m >= 2p - 1: 2m(F + B + W) + (p - 1) max(B, 2(B - W)).
//
// Memory. The peaks above count chunk activations computed and not yet freed. The executor's
// slots (parallel/pipeline.cu) also hold what the message placement receives early or sends
// late: nothing more for gpipe, 1f1b and zb-h1; in zb-v at most one slot whose input gradient
// waits for its busy receiver; on the interleaved schedule's rank 0 the activations it receives
// early from rank p-1 (floor(log2 p) more for m > p, for every p <= 16 tried).
//
// Timelines, p = 4, m = 8 (interleaved: m = 4), F = B = W = 1 per chunk, as the simulator draws
// them (one column pair per unit; "B3==": the whole backward of micro-batch 3 when unsplit, lower
// case for chunk 1), each with its makespan, its bubble and the most chunk activations each rank
// holds ("peak", per rank), and at v = 2 "1f1b:" the makespan of 1f1b on the same model (one
// stage per rank, F = 2 and B + W = 4 per stage); test/test_pipeline_headers.cpp draws them and
// checks them here:
//
//   gpipe, 33 units, bubble 27.3%, peak 8, 8, 8, 8
//   rank 0 |F0F1F2F3F4F5F6F7..................B0==B1==B2==B3==B4==B5==B6==B7==|
//   rank 1 |..F0F1F2F3F4F5F6F7............B0==B1==B2==B3==B4==B5==B6==B7==....|
//   rank 2 |....F0F1F2F3F4F5F6F7......B0==B1==B2==B3==B4==B5==B6==B7==........|
//   rank 3 |......F0F1F2F3F4F5F6F7B0==B1==B2==B3==B4==B5==B6==B7==............|
//
//   1f1b, 33 units, bubble 27.3%, peak 4, 3, 2, 1
//   rank 0 |F0F1F2F3............B0==F4B1==F5B2==F6B3==F7B4==..B5==..B6==..B7==|
//   rank 1 |..F0F1F2........B0==F3B1==F4B2==F5B3==F6B4==F7B5==..B6==..B7==....|
//   rank 2 |....F0F1....B0==F2B1==F3B2==F4B3==F5B4==F6B5==F7B6==..B7==........|
//   rank 3 |......F0B0==F1B1==F2B2==F3B3==F4B4==F5B5==F6B6==F7B7==............|
//
//   zb-h1, 27 units, bubble 11.1%, peak 4, 4, 4, 4
//   rank 0 |F0F1F2F3......B0W0F4B1W1F5B2W2F6B3W3F7B4W4B5W5B6W6B7W7|
//   rank 1 |..F0F1F2....B0F3B1W0F4B2W1F5B3W2F6B4W3F7B5W4B6W5B7W6W7|
//   rank 2 |....F0F1..B0F2B1F3B2W0F4B3W1F5B4W2F6B5W3F7B6W4B7W5W6W7|
//   rank 3 |......F0B0F1B1F2B2F3B3W0F4B4W1F5B5W2F6B6W3F7B7W4W5W6W7|
//
//   interleaved (v = 2, m = 4), 33 units, bubble 27.3%, peak 8, 7, 6, 5; 1f1b: 42 units
//   rank 0 |F0F1F2F3f0f1f2f3............b0==..b1==..b2==..b3==B0==B1==B2==B3==|
//   rank 1 |..F0F1F2F3f0f1f2........b0==f3b1==..b2==..b3==B0==B1==B2==B3==....|
//   rank 2 |....F0F1F2F3f0f1....b0==f2b1==f3b2==..b3==B0==B1==B2==B3==........|
//   rank 3 |......F0F1F2F3f0b0==f1b1==f2b2==f3b3==B0==B1==B2==B3==............|
//
//   zb-v (v = 2, V order), 51 units, bubble 5.9%, peak 8, 8, 8, 8; 1f1b: 66 units
//   rank 0 |F0F1F2F3F4F5F6f0b0w0f1b1w1f2b2w2f3b3w3F7B0W0f4b4w4B1W1f5b5w5B2W2f6b6w6B3W3f7b7w7B4W4B5W5B6W6B7W7......|
//   rank 1 |..F0F1F2F3F4f0F5f1b0w0f2b1w1f3b2w2F6B0W0f4b3w3F7B1W1f5b4w4B2W2f6b5w5B3W3f7b6w6B4b7B5W4B6W5B7W6w7W7....|
//   rank 2 |....F0F1F2f0F3f1F4f2b0w0f3b1w1F5B0W0f4b2w2F6B1W1f5b3w3F7B2W2f6b4w4B3W3f7b5w5B4b6B5b7B6W4B7W5w6w7W6W7..|
//   rank 3 |......F0f0F1f1F2f2F3f3b0w0F4B0W0f4b1w1F5B1W1f5b2w2F6B2W2f6b3w3F7B3W3f7b4w4B4b5B5b6B6b7B7W4w5w6w7W5W6W7|
//
// The lists. Each compute action is preceded by the receive of its input and followed by the
// send of its output, when the neighbouring stage is on another rank (per step m*(p*v - 1)
// messages each way, whose bytes parallel/pipeline.cu counts; a W sends nothing). In the 1f1b
// steady state that gives F(i) send-fwd(i) recv-bwd(j) B(j) send-bwd(j) recv-fwd(i+1) F(i+1).
// The executor posts each run of consecutive sends and receives (pipeline_comm_runs) as one
// batched operation that returns when all of it is done. Sends and receives between two ranks
// match per channel (pipeline_channel: the activations of a chunk, the gradients of a chunk), in
// posting order; so at p = 2, where activations and gradients of both chunks share the one pair
// of ranks, each kind still arrives in its own order. pipeline_build ends by handing the lists to
// pipeline_place_messages.
#include "parallel/pipeline_schedule.h"

#include <algorithm>
#include <cstdio>

#include "kernels/common.h"

const char* pipe_op_name(PipeOp op) {
  static const char* names[] = {"F",        "B",        "W",       "send-fwd",
                                "recv-fwd", "send-bwd", "recv-bwd"};
  return names[(int)op];
}

bool pipe_op_is_comm(PipeOp op) {
  return op != PipeOp::Forward && op != PipeOp::Backward && op != PipeOp::Weight;
}
bool pipe_op_is_send(PipeOp op) { return op == PipeOp::SendForward || op == PipeOp::SendBackward; }
bool pipe_op_is_forward_message(PipeOp op) {
  return op == PipeOp::SendForward || op == PipeOp::RecvForward;
}

// ---------------------------------------------------------------------------------------------
// Stage orders
// ---------------------------------------------------------------------------------------------
int pipeline_stage(StageOrder order, int p, int rank, int chunk) {
  if (order == StageOrder::V && chunk == 1) return 2 * p - 1 - rank;
  return chunk * p + rank;
}
int pipeline_stage_owner(StageOrder order, int p, int stage) {
  if (order == StageOrder::V && stage >= p) return 2 * p - 1 - stage;
  return stage % p;
}
int pipeline_stage_chunk(StageOrder order, int p, int stage) { return stage / p; }

int PipelineSchedule::stage(int rank, int chunk) const {
  return pipeline_stage(order, p, rank, chunk);
}
int PipelineSchedule::owner(int s) const { return pipeline_stage_owner(order, p, s); }
int PipelineSchedule::chunk_of(int s) const { return pipeline_stage_chunk(order, p, s); }

int pipeline_channel(const PipelineSchedule& s, int rank, const PipeAction& a) {
  const bool forward = pipe_op_is_forward_message(a.op);
  int sender_chunk = a.chunk;
  if (!pipe_op_is_send(a.op))  // the sender holds the neighbouring stage
    sender_chunk = s.chunk_of(s.stage(rank, a.chunk) + (forward ? -1 : 1));
  return (forward ? 0 : s.v) + sender_chunk;
}

// ---------------------------------------------------------------------------------------------
// Formulas (the header derives them)
// ---------------------------------------------------------------------------------------------
double pipeline_bubble(int p, int m, int v) { return (double)(p - 1) / (v * m + p - 1); }

double pipeline_schedule_bubble(const std::string& kind, int p, int m, int v) {
  if (kind == "zb-h1") return 1.0 - 3.0 * m / std::max(3 * m + p - 1, 2 * m + 2 * p - 1);
  if (kind == "zb-v") return 1.0 - 6.0 * m / (6 * m + std::max(p - 1, 2 * (2 * p - 1 - m)));
  if (kind.rfind("file:", 0) == 0) return 0;
  return pipeline_bubble(p, m, v);
}

static int warmup(const std::string& kind, int p, int m, int v, int rank) {
  const int total = m * v;
  if (kind == "gpipe") return total;
  if (kind == "1f1b" || kind == "zb-h1") return std::min(p - rank - 1, m);
  return std::min((p - rank - 1) + (v - 1) * p, total);
}

int pipeline_peak_formula(const std::string& kind, int p, int m, int v, int r) {
  if (kind == "gpipe") return m;
  if (kind == "1f1b") return std::min(p - r, m);
  if (kind == "interleaved") return std::min(warmup(kind, p, m, v, r) + 1, m * v);
  if (kind == "zb-h1") return std::min(p, m);
  if (kind == "zb-v") return std::min({m + 1 + r, 2 * m, 2 * p});
  return -1;
}

// ---------------------------------------------------------------------------------------------
// The compute orders
// ---------------------------------------------------------------------------------------------
static PipeAction compute_action(PipeOp op, int micro, int chunk) { return {op, micro, chunk, -1}; }

// The k-th forward (or backward) a rank runs: micro-batch and chunk. One chunk: micro-batches in
// order. Interleaved: groups of p micro-batches, each group through chunk 0, 1, ..., v-1 in the
// forward and v-1, ..., 0 in the backward, then the next group.
static PipeAction kth(const PipelineSchedule& s, int k, bool forward) {
  const PipeOp op = forward ? PipeOp::Forward : PipeOp::Backward;
  if (s.v == 1) return compute_action(op, k, 0);
  const int group = k / (s.p * s.v), chunk = (k / s.p) % s.v;
  return compute_action(op, group * s.p + k % s.p, forward ? chunk : s.v - 1 - chunk);
}

// gpipe, 1f1b, interleaved: w warm-up forwards, then one forward and one backward at a time
// (steady state), then the remaining backwards (cool-down).
static std::vector<PipeAction> one_f_one_b(const PipelineSchedule& s, int r) {
  const int total = s.m * s.v, w = warmup(s.kind, s.p, s.m, s.v, r);
  std::vector<PipeAction> out;
  for (int k = 0; k < w; ++k) out.push_back(kth(s, k, true));
  for (int k = 0; k < total - w; ++k) {
    out.push_back(kth(s, w + k, true));
    out.push_back(kth(s, k, false));
  }
  for (int k = total - w; k < total; ++k) out.push_back(kth(s, k, false));
  return out;
}

// zb-h1: 1f1b's order of forwards and backwards (B only), each B followed by the W of the
// micro-batch r places earlier, and the W's still owed at the end.
static std::vector<PipeAction> zb_h1(const PipelineSchedule& s, int r) {
  std::vector<PipeAction> out;
  int w_done = 0;
  for (const PipeAction& a : one_f_one_b(s, r)) {
    out.push_back(a);
    if (a.op == PipeOp::Backward && a.micro - w_done >= r)
      out.push_back(compute_action(PipeOp::Weight, w_done++, 0));
  }
  while (w_done < s.m) out.push_back(compute_action(PipeOp::Weight, w_done++, 0));
  return out;
}

// zb-v for n = max(m, 2p - 1) micro-batches (the phases of the header), then without the
// micro-batches >= m.
static std::vector<PipeAction> zb_v(const PipelineSchedule& s, int r) {
  const int p = s.p, n = std::max(s.m, 2 * p - 1);
  std::vector<PipeAction> out;
  int f[2] = {0, 0}, b[2] = {0, 0}, w[2] = {0, 0};  // next micro-batch per chunk
  auto F = [&](int c) { out.push_back(compute_action(PipeOp::Forward, f[c]++, c)); };
  auto B = [&](int c) { out.push_back(compute_action(PipeOp::Backward, b[c]++, c)); };
  auto W = [&](int c) { out.push_back(compute_action(PipeOp::Weight, w[c]++, c)); };
  for (int k = 0; k < 2 * (p - r) - 1; ++k) F(0);
  for (int k = 0; k < r; ++k) F(1), F(0);
  for (int k = 0; k < p - r; ++k) F(1), B(1), W(1);
  while (f[1] < f[0] || f[0] < n) {
    if (f[0] < n) F(0);
    B(0), W(0), F(1), B(1), W(1);
  }
  for (int k = 0; k < r; ++k) B(0), B(1);
  for (int k = 0; k < p - r; ++k) B(0), W(0);
  while (w[1] < b[1]) W(1);
  while (w[0] < b[0]) W(0);
  std::vector<PipeAction> kept;
  for (const PipeAction& a : out)
    if (a.micro < s.m) kept.push_back(a);
  return kept;
}

// ---------------------------------------------------------------------------------------------
// Building (the rules a schedule obeys are config/layout_rules.cu's pipeline_rules, checked when
// the config is read)
// ---------------------------------------------------------------------------------------------
// A compute action with the communication around it: the receive of its input right before it,
// the send of its output right after it. None between two stages of the same rank, and none
// around a W (its inputs are the slot's, its outputs the gradients').
std::vector<PipeAction> pipeline_with_messages(const PipelineSchedule& s, int r,
                                               const std::vector<PipeAction>& computes) {
  std::vector<PipeAction> out;
  const int S = s.p * s.v;
  for (const PipeAction& a : computes) {
    if (a.op == PipeOp::Weight) {
      out.push_back(a);
      continue;
    }
    const int stage = s.stage(r, a.chunk);
    const bool fwd = a.op == PipeOp::Forward;
    const int from = fwd ? stage - 1 : stage + 1;  // the stage this action's input comes from
    const int to = fwd ? stage + 1 : stage - 1;    // the stage its output goes to
    if (from >= 0 && from < S && s.owner(from) != r)
      out.push_back({fwd ? PipeOp::RecvForward : PipeOp::RecvBackward, a.micro, a.chunk,
                     s.owner(from), a.line});
    out.push_back(a);
    if (to >= 0 && to < S && s.owner(to) != r)
      out.push_back({fwd ? PipeOp::SendForward : PipeOp::SendBackward, a.micro, a.chunk,
                     s.owner(to), a.line});
  }
  return out;
}

PipelineSchedule pipeline_build(const std::string& kind, int p, int m, int v) {
  PipelineSchedule s;
  if (kind.rfind("file:", 0) == 0) {
    const std::string err = pipeline_read_file(kind.substr(5), p, m, v, &s);
    CHECK(err.empty(), "%s", err.c_str());
    return s;
  }
  const std::string err = pipeline_rules(kind, p, m, v, 0);
  CHECK(err.empty(), "%s", err.c_str());
  s.kind = kind, s.p = p, s.m = m, s.v = v;
  s.order = kind == "zb-v" ? StageOrder::V : StageOrder::Loop;
  s.split = kind == "zb-h1" || kind == "zb-v";
  for (int r = 0; r < p; ++r) {
    const std::vector<PipeAction> computes =
        kind == "zb-h1" ? zb_h1(s, r) : kind == "zb-v" ? zb_v(s, r) : one_f_one_b(s, r);
    s.ranks.push_back(pipeline_with_messages(s, r, computes));
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
