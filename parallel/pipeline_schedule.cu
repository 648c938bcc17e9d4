// parallel/pipeline_schedule.cu - pipeline schedules as data (gpipe, 1f1b, interleaved 1f1b),
// their validation, and a simulator that runs the per-rank action lists against each other. No
// communication and no model: the executor that runs these lists with stage_forward/backward and
// send_recv (parallel/comm.h) comes later; this file decides who does what, in which order.
//
// The idea. Pipeline parallelism cuts the model into stages, one per rank, and the batch into m
// micro-batches. Micro-batch i flows forward through stages 0, 1, ..., p-1 (each stage sending its
// output activation to the next) and its gradient flows back through p-1, ..., 0. A stage can
// only work on micro-batch i after its neighbour did, so at the start and at the end of every
// step some ranks wait: the pipeline bubble.
//
//   gpipe: every rank runs all m forwards, then all m backwards. Simple, but rank 0 holds the
//          activations of all m micro-batches at the peak: memory grows with m.
//   1f1b:  rank r runs w = min(p - r - 1, m) forwards (warm-up: just enough to fill the
//          pipeline below it), then alternates one forward and one backward (steady state),
//          then runs the backwards still owed (cool-down). A backward frees its micro-batch's
//          activations, so rank r never holds more than min(p - r, m) micro-batches: memory
//          is bounded by p, not m, and m can grow to shrink the bubble without costing memory.
//
// The bubble. With forward F and backward B per stage and free communication, both schedules
// take (m + p - 1)(F + B): each rank computes m(F + B) and idles (p - 1)(F + B), spread over the
// warm-up and the cool-down. Bubble fraction (p - 1)/(m + p - 1): small only when m >> p.
//
//   interleaved (Megatron's interleaved 1f1b): each rank holds v smaller chunks instead of one
//          stage; chunk c of rank r is stage c*p + r of S = p*v stages, so a micro-batch visits
//          every rank v times. Micro-batches go through the chunks in groups of p (forward:
//          group 0 through chunk 0, then chunk 1, ..., then group 1; backward: chunks in reverse),
//          which needs m % p == 0. Warm-up w = (p - r - 1) + (v - 1)p chunk forwards (capped at
//          m*v), then 1f1b on chunks. A chunk costs F/v and B/v, the pipeline fills v times
//          faster, and the makespan is (m*v + p - 1)(F + B)/v: bubble (p - 1)/(v*m + p - 1).
//          Peak live: min(w + 1, m*v) chunks = at most p*v chunks, i.e. p stages' worth of
//          layers, like 1f1b. The price: v times more boundary messages.
//
// The simulator (pipeline_simulate) checks that these are the exact makespans of the lists this
// file builds (test/test_pipeline_schedule.cpp asserts makespan == (v*m + p - 1)(F + B) with per
// chunk costs F = 1, B = 2, for every p <= 4 and the m, v tested), with free communication.
// Megatron-LM warms up (p - r - 1)*2 + (v - 1)p chunks to leave room for slow communication; here
// communication is free in the model, and the smaller warm-up already reaches the ideal.
//
// Who talks to whom, bytes. Stage s sends to s + 1 and receives from s + 1 (ranks r and r + 1,
// and rank p-1 to rank 0 between chunks when interleaved). Per micro-batch and boundary: the
// activation forward, B*T*C elements (micro_batch x seq_len x d_model, in the compute dtype), and
// its gradient backward, the same size; under sequence parallelism each tp rank sends only its
// B*T/tp*C slice (to its own tp rank of the next stage). Per step: m*(p*v - 1) messages each way.
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
// send of its output, when the neighbouring stage is on another rank. In the steady state that
// gives F(i) send-fwd(i) recv-bwd(j) B(j) send-bwd(j) recv-fwd(i+1) F(i+1): the executor posts
// each run of consecutive sends and receives as one send_recv, which is what keeps two neighbours
// that send to each other at the same time from waiting on each other. Sends and receives between
// two ranks must be posted in the same order on both ends (NCCL and MPI tag 0 match in posting
// order); the simulator keeps one first-in first-out queue per ordered pair of ranks and fails on
// a receive that does not match the front of its queue. At p = 2 the interleaved schedule would
// put activations and gradients on the same channel in different orders, hence its p >= 3 rule.
#include "parallel/pipeline_schedule.h"

#include <algorithm>
#include <cstdio>
#include <deque>
#include <map>

#include "kernels/common.h"

const char* pipe_op_name(PipeOp op) {
  static const char* names[] = {"F", "B", "send-fwd", "recv-fwd", "send-bwd", "recv-bwd"};
  return names[(int)op];
}

// ---------------------------------------------------------------------------------------------
// Rules
// ---------------------------------------------------------------------------------------------
static std::string format(const char* fmt, int a, int b = 0, int c = 0, int d = 0) {
  char buf[320];
  std::snprintf(buf, sizeof(buf), fmt, a, b, c, d);
  return buf;
}

std::string pipeline_validate(const std::string& kind, int p, int m, int v, int n_layer) {
  std::string msg;
  auto add = [&](const std::string& line) { msg += (msg.empty() ? "" : "\n") + line; };
  const bool interleaved = kind == "interleaved";
  if (kind != "gpipe" && kind != "1f1b" && !interleaved)
    add("pipeline: schedule \"" + kind + "\" is unknown (one of \"gpipe\", \"1f1b\", "
        "\"interleaved\")");
  if (p < 1 || m < 1 || v < 1) {
    add(format("pipeline: pp = %d, micro-batches m = %d and virtual chunks v = %d must each be "
               "at least 1", p, m, v));
    return msg;  // the rules below divide by these
  }
  if (v > 1 && !interleaved)
    add(format("pipeline: v = %d chunks per rank needs the \"interleaved\" schedule (\"", v) +
        kind + "\" runs one chunk per rank)");
  if (interleaved && v < 2)
    add("pipeline: the \"interleaved\" schedule needs v >= 2 chunks per rank (with one chunk "
        "per rank it is \"1f1b\")");
  if (interleaved && p < 3)
    add(format("pipeline: the \"interleaved\" schedule needs pp >= 3, not %d (at pp = 2 the "
               "activations and the gradients between the two ranks share one ordered channel "
               "and would have to interleave in the same order on both ends)", p));
  if (interleaved && m % p != 0)
    add(format("pipeline: the \"interleaved\" schedule needs the micro-batches m = %d to be a "
               "multiple of pp = %d (they go through each chunk in groups of pp)", m, p));
  if (n_layer > 0 && n_layer % (p * v) != 0)
    add(format("pipeline: n_layer = %d is not a multiple of pp*v = %d*%d = %d (each of the pp*v "
               "stages holds the same number of blocks)", n_layer, p, v, p * v));
  return msg;
}

// ---------------------------------------------------------------------------------------------
// Building
// ---------------------------------------------------------------------------------------------
int pipeline_warmup(const std::string& kind, int p, int m, int v, int rank) {
  const int total = m * v;
  if (kind == "gpipe") return total;
  if (kind == "1f1b") return std::min(p - rank - 1, m);
  return std::min((p - rank - 1) + (v - 1) * p, total);
}

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
// the remaining backwards (cool-down).
PipelineSchedule pipeline_build(const std::string& kind, int p, int m, int v) {
  const std::string err = pipeline_validate(kind, p, m, v, 0);
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
  return s;
}

// ---------------------------------------------------------------------------------------------
// Simulation
// ---------------------------------------------------------------------------------------------
namespace {

struct Message {
  bool forward;  // an activation going forward (else a gradient going backward)
  int micro, stage;  // the sender's micro-batch and stage
  double time;       // when it was sent
};

// What the simulator tracks. Per rank r, chunk c, micro-batch i (index (c*m + i)): the time a
// forward / backward finished and the time its input arrived (-1: not yet).
struct SimState {
  const PipelineSchedule& s;
  std::vector<size_t> pc;     // per rank: index of the next action
  std::vector<double> clock;  // per rank: when the next action may start
  std::vector<int> live;
  std::vector<std::vector<double>> fwd_done, bwd_done, fwd_input, bwd_input;
  std::map<std::pair<int, int>, std::deque<Message>> queues;  // (from rank, to rank)
};

std::string describe(const SimState& st, int r, const PipeAction& a) {
  char buf[160];
  std::snprintf(buf, sizeof(buf), "rank %d action %zu (%s micro %d chunk %d stage %d peer %d)", r,
                st.pc[r], pipe_op_name(a.op), a.micro, a.chunk, a.chunk * st.s.p + r, a.peer);
  return buf;
}

enum class Step { Done, Blocked, Error };

// Sends complete at once; a receive takes the first message from its peer, which must be the one
// it expects. Fills *err on a broken rule.
Step communicate(SimState& st, int r, const PipeAction& a, int idx, std::string* err) {
  const PipelineSchedule& s = st.s;
  const int stage = a.chunk * s.p + r;
  const bool fwd = a.op == PipeOp::SendForward || a.op == PipeOp::RecvForward;
  const bool downstream = a.op == PipeOp::SendForward || a.op == PipeOp::RecvBackward;
  const int other = downstream ? stage + 1 : stage - 1;  // the stage at the other end
  if (other < 0 || other >= s.p * s.v || other % s.p != a.peer) {
    *err = describe(st, r, a) + ": the peer does not hold the neighbouring stage";
    return Step::Error;
  }
  if (a.op == PipeOp::SendForward || a.op == PipeOp::SendBackward) {
    const double t = fwd ? st.fwd_done[r][idx] : st.bwd_done[r][idx];
    if (t < 0) {
      *err = describe(st, r, a) + ": sends a tensor not computed yet";
      return Step::Error;
    }
    st.queues[{r, a.peer}].push_back({fwd, a.micro, stage, st.clock[r]});
    return Step::Done;
  }
  std::deque<Message>& q = st.queues[{a.peer, r}];
  if (q.empty()) return Step::Blocked;
  const Message msg = q.front();
  if (msg.forward != fwd || msg.micro != a.micro || msg.stage != other) {
    char buf[120];
    std::snprintf(buf, sizeof(buf), ": the next message from rank %d is %s micro %d of stage %d",
                  a.peer, msg.forward ? "activation" : "gradient", msg.micro, msg.stage);
    *err = describe(st, r, a) + buf;
    return Step::Error;
  }
  q.pop_front();
  st.clock[r] = std::max(st.clock[r], msg.time);
  (fwd ? st.fwd_input : st.bwd_input)[r][idx] = msg.time;
  return Step::Done;
}

// A forward needs its input: the data (stage 0), a received activation, or the previous stage's
// output on this same rank (p = 1). A backward needs its own forward and its output gradient:
// the loss (last stage), a received gradient, or the next stage's on this rank.
Step compute(SimState& st, int r, const PipeAction& a, int idx, double F, double B,
             PipelineSimulation& out, std::string* err) {
  const PipelineSchedule& s = st.s;
  const int S = s.p * s.v, stage = a.chunk * s.p + r, m = s.m;
  const bool fwd = a.op == PipeOp::Forward;
  const int from = fwd ? stage - 1 : stage + 1;
  bool has_input = from < 0 || from >= S || (fwd ? st.fwd_input : st.bwd_input)[r][idx] >= 0;
  if (!has_input && from % s.p == r)  // the neighbouring stage is on this rank
    has_input = (fwd ? st.fwd_done : st.bwd_done)[r][(from / s.p) * m + a.micro] >= 0;
  if (!fwd && st.fwd_done[r][idx] < 0) *err = describe(st, r, a) + ": backward before forward";
  else if (!has_input) *err = describe(st, r, a) + ": its input was never received";
  else if ((fwd ? st.fwd_done : st.bwd_done)[r][idx] >= 0) *err = describe(st, r, a) + ": twice";
  if (!err->empty()) return Step::Error;
  out.starts[r].push_back({st.clock[r], a});
  st.clock[r] += fwd ? F : B;
  out.busy[r] += fwd ? F : B;
  (fwd ? st.fwd_done : st.bwd_done)[r][idx] = st.clock[r];
  st.live[r] += fwd ? 1 : -1;
  out.peak_live[r] = std::max(out.peak_live[r], st.live[r]);
  return Step::Done;
}

Step step(SimState& st, int r, double F, double B, PipelineSimulation& out, std::string* err) {
  const PipeAction& a = st.s.ranks[r][st.pc[r]];
  if (a.micro < 0 || a.micro >= st.s.m || a.chunk < 0 || a.chunk >= st.s.v) {
    *err = describe(st, r, a) + ": micro-batch or chunk out of range";
    return Step::Error;
  }
  const int idx = a.chunk * st.s.m + a.micro;
  if (a.op == PipeOp::Forward || a.op == PipeOp::Backward)
    return compute(st, r, a, idx, F, B, out, err);
  return communicate(st, r, a, idx, err);
}

}  // namespace

// Runs every rank as far as it can, round after round, until all are done or none can move.
// Only receives block, and a message's time is fixed by its sender's order alone, so the result
// does not depend on which rank the loop visits first.
PipelineSimulation pipeline_simulate(const PipelineSchedule& s, double F, double B) {
  const int p = s.p;
  PipelineSimulation out;
  out.busy.assign(p, 0.0);
  out.peak_live.assign(p, 0);
  out.starts.resize(p);
  const std::vector<double> unset(s.m * s.v, -1.0);
  SimState st{s, std::vector<size_t>(p, 0), std::vector<double>(p, 0.0), std::vector<int>(p, 0),
              {}, {}, {}, {}, {}};
  for (auto* v : {&st.fwd_done, &st.bwd_done, &st.fwd_input, &st.bwd_input}) v->assign(p, unset);
  for (;;) {
    bool moved = false, finished = true;
    for (int r = 0; r < p; ++r) {
      while (st.pc[r] < s.ranks[r].size()) {
        const Step result = step(st, r, F, B, out, &out.error);
        if (result == Step::Error) return out;
        if (result == Step::Blocked) break;
        ++st.pc[r];
        moved = true;
      }
      finished = finished && st.pc[r] == s.ranks[r].size();
    }
    if (finished) break;
    if (!moved) {
      out.error = "deadlock:";
      for (int r = 0; r < p; ++r)
        if (st.pc[r] < s.ranks[r].size()) out.error += " " + describe(st, r, s.ranks[r][st.pc[r]]);
      return out;
    }
  }
  for (int r = 0; r < p; ++r) out.makespan = std::max(out.makespan, st.clock[r]);
  return out;
}

std::string pipeline_timeline(const PipelineSchedule& s, const PipelineSimulation& sim, double F,
                              double B) {
  const int width = (int)sim.makespan;
  std::string text;
  for (int r = 0; r < s.p; ++r) {
    std::string line(2 * width, '.');
    for (const auto& [t, a] : sim.starts[r]) {
      const bool fwd = a.op == PipeOp::Forward;
      const int begin = (int)t, units = (int)(fwd ? F : B);
      char label[3] = {fwd ? 'F' : 'B', "0123456789abcdef"[a.micro % 16], 0};
      if (a.chunk > 0) label[0] = fwd ? 'f' : 'b';
      for (int u = 0; u < units && begin + u < width; ++u)
        line.replace(2 * (begin + u), 2, u == 0 ? label : "==");
    }
    text += "rank " + std::to_string(r) + " |" + line + "|\n";
  }
  return text;
}
