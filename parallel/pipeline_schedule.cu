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
// chunk costs F = 1, B = 2, for every p <= 4 and the m, v tested), with free communication, and
// under both ways a send can complete (buffered and rendezvous, below). Megatron-LM warms up
// (p - r - 1)*2 + (v - 1)p chunks to leave room for slow communication; here communication is
// free in the model, and the smaller warm-up already reaches the ideal (under rendezvous exactly
// only at B = 2F, see "Where the messages go").
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
// gives F(i) send-fwd(i) recv-bwd(j) B(j) send-bwd(j) recv-fwd(i+1) F(i+1). The executor posts
// each run of consecutive sends and receives (pipeline_comm_runs) as one batched operation, an
// NCCL group or MPI Isend/Irecv and one Waitall, that returns when all of it is done. Sends and
// receives between two ranks must be posted in the same order on both ends (NCCL and MPI tag 0
// match in posting order); the simulator keeps one first-in first-out queue per ordered pair of
// ranks and fails on a receive that does not match the front of its queue. At p = 2 the
// interleaved schedule would put activations and gradients on the same channel in different
// orders, hence its p >= 3 rule.
//
// Buffered or rendezvous: when is a send done? Buffered: at once, the message waits at the
// receiver (MPI does this for small messages, "eager"). Rendezvous: only once the peer has posted
// the matching receive; NCCL always works so, and MPI for messages above its eager limit (some
// kilobytes; an activation is megabytes). The executor lives under rendezvous, which is stricter,
// and pipeline_simulate runs either (PipeComm). Two neighbours that send to each other and then
// receive are fine when each does it in one run: F(i) send-fwd(i) recv-bwd(j) on rank r meets
// B(j) send-bwd(j) recv-fwd(i+1) on rank r+1, all four are posted, all complete. With the send
// and the receive in separate runs and a compute between, both are stuck for ever: each send
// waits for a receive that the other rank posts only after its own send is done. Buffered, the
// same lists run (test/test_pipeline_schedule.cpp has one).
//
// Where the messages go. Under rendezvous a message moves when both ends are between computes at
// the same moment; whoever gets there first waits. In gpipe and 1f1b the lists above meet that
// everywhere in the ideal timeline. The interleaved schedule's link from rank p-1 back to rank 0
// does not: there each activation waits p*B and each gradient p*F between send and receive
// (buffered, the transport holds them), and with m > p the lists deadlock: every rank sends a
// gradient down the ring (rank 0 to rank p-1 across the link) in a run its receiver reaches only
// after its own such send is done, a cycle of p waits. So pipeline_build moves each message to a
// gap of its sender (after its compute) and a gap of its receiver (before its compute) that
// overlap in the timeline with F = 1, B = 2 (place_messages): rank 0 posts the receive of an
// activation from rank p-1 early and holds it until its forward (at most 4 such tensors at once
// at p = 4, 6 at p = 8, 12 at p = 16, where it held 1), rank p-1 likewise some gradients. At
// those costs every compute starts when it did, in both modes. At other costs the lists still
// never deadlock (that depends on the order alone), but the link costs time: with v = 2, up to
// about 8% over the ideal when B = 3F (activation recomputation), 31% when B = F, approached as
// m grows. Holding a message in flight is what buffering did for free; under rendezvous a rank
// must stop to take it, at a fixed point of its list, and which point is on time depends on B/F.
// Megatron's larger warm-up is the robust alternative.
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

static void place_messages(PipelineSchedule& s);  // below, after the simulator it uses

// Every rank: w warm-up forwards, then one forward and one backward at a time (steady state), then
// the remaining backwards (cool-down). Then the messages move to where rendezvous needs them.
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
  if (p > 1) place_messages(s);
  return s;
}

// ---------------------------------------------------------------------------------------------
// Simulation
// ---------------------------------------------------------------------------------------------
bool pipe_op_is_comm(PipeOp op) { return op != PipeOp::Forward && op != PipeOp::Backward; }
bool pipe_op_is_send(PipeOp op) { return op == PipeOp::SendForward || op == PipeOp::SendBackward; }

double pipeline_bubble(int p, int m, int v) { return (double)(p - 1) / (v * m + p - 1); }

std::vector<std::pair<size_t, size_t>> pipeline_comm_runs(const std::vector<PipeAction>& actions) {
  std::vector<std::pair<size_t, size_t>> runs;
  for (size_t i = 0; i < actions.size(); ++i) {
    if (!pipe_op_is_comm(actions[i].op)) continue;
    if (runs.empty() || runs.back().second != i) runs.push_back({i, i});
    runs.back().second = i + 1;
  }
  return runs;
}

namespace {

struct Message {
  bool forward;  // an activation going forward (else a gradient going backward)
  int micro, stage;  // the sender's micro-batch and stage
  double time;       // when it was sent
};

// Rendezvous: a send or receive posted and waiting for its partner. Who, which action, when.
struct Posted {
  int rank;
  size_t action;
  double time;
};

// What the simulator tracks. Per rank r, chunk c, micro-batch i (index (c*m + i)): the time a
// forward / backward finished and the time its input arrived (-1: not yet).
struct SimState {
  const PipelineSchedule& s;
  PipeComm mode;
  std::vector<size_t> pc;     // per rank: index of the next action
  std::vector<double> clock;  // per rank: when the next action may start
  std::vector<int> live;
  std::vector<std::vector<double>> fwd_done, bwd_done, fwd_input, bwd_input;
  std::map<std::pair<int, int>, std::deque<Message>> queues;  // buffered: (from rank, to rank)
  // Rendezvous. Per rank: its runs of sends and receives (pipeline_comm_runs), the index of the
  // current one, how many of its operations still wait for a partner (-1: not posted yet), the
  // latest post time among the partners matched so far, and which actions are matched.
  std::vector<std::vector<std::pair<size_t, size_t>>> runs;
  std::vector<size_t> run;
  std::vector<int> unmatched;
  std::vector<double> partner_time;
  std::vector<std::vector<char>> matched;
  std::map<std::pair<int, int>, std::deque<Posted>> sends, recvs;  // (from rank, to rank)

  SimState(const PipelineSchedule& sched, PipeComm comm)
      : s(sched), mode(comm), pc(s.p, 0), clock(s.p, 0.0), live(s.p, 0), run(s.p, 0),
        unmatched(s.p, -1), partner_time(s.p, 0.0) {
    const std::vector<double> unset(s.m * s.v, -1.0);
    for (auto* v : {&fwd_done, &bwd_done, &fwd_input, &bwd_input}) v->assign(s.p, unset);
    for (const std::vector<PipeAction>& actions : s.ranks) {
      runs.push_back(pipeline_comm_runs(actions));
      matched.emplace_back(actions.size(), 0);
    }
  }
};

std::string describe(const SimState& st, int r, size_t i) {
  const PipeAction& a = st.s.ranks[r][i];
  char buf[160];
  std::snprintf(buf, sizeof(buf), "rank %d action %zu (%s micro %d chunk %d stage %d peer %d)", r,
                i, pipe_op_name(a.op), a.micro, a.chunk, a.chunk * st.s.p + r, a.peer);
  return buf;
}

enum class Step { Done, Posted, Blocked, Error };  // Posted: a run went out, and waits

// The index of action i of rank r into fwd_done and friends, -1 (and *err) when out of range.
int index_of(const SimState& st, int r, size_t i, std::string* err) {
  const PipeAction& a = st.s.ranks[r][i];
  if (a.micro >= 0 && a.micro < st.s.m && a.chunk >= 0 && a.chunk < st.s.v)
    return a.chunk * st.s.m + a.micro;
  *err = describe(st, r, i) + ": micro-batch or chunk out of range";
  return -1;
}

// A send or receive of rank r: its peer must hold the neighbouring stage, and a send's tensor
// must be computed. Returns the stage at the other end, -1 (and *err) on a broken rule.
int check_comm(const SimState& st, int r, size_t i, int idx, std::string* err) {
  const PipelineSchedule& s = st.s;
  const PipeAction& a = s.ranks[r][i];
  const bool downstream = a.op == PipeOp::SendForward || a.op == PipeOp::RecvBackward;
  const int stage = a.chunk * s.p + r, other = downstream ? stage + 1 : stage - 1;
  if (other < 0 || other >= s.p * s.v || other % s.p != a.peer) {
    *err = describe(st, r, i) + ": the peer does not hold the neighbouring stage";
    return -1;
  }
  if ((a.op == PipeOp::SendForward && st.fwd_done[r][idx] < 0) ||
      (a.op == PipeOp::SendBackward && st.bwd_done[r][idx] < 0)) {
    *err = describe(st, r, i) + ": sends a tensor not computed yet";
    return -1;
  }
  return other;
}

// "" if receive i of rank r expects this message (direction, micro-batch, sender's stage).
std::string mismatch(const SimState& st, int r, size_t i, bool forward, int micro, int stage) {
  const PipeAction& a = st.s.ranks[r][i];
  const int want = a.chunk * st.s.p + r + (a.op == PipeOp::RecvForward ? -1 : 1);
  if (forward == (a.op == PipeOp::RecvForward) && micro == a.micro && stage == want) return "";
  char buf[120];
  std::snprintf(buf, sizeof(buf), ": the next message from rank %d is %s micro %d of stage %d",
                a.peer, forward ? "activation" : "gradient", micro, stage);
  return describe(st, r, i) + buf;
}

// Buffered: a send completes at once; a receive takes the first message from its peer, which
// must be the one it expects. Fills *err on a broken rule.
Step communicate(SimState& st, int r, std::string* err) {
  const size_t i = st.pc[r];
  const PipeAction& a = st.s.ranks[r][i];
  const int idx = index_of(st, r, i, err);
  if (idx < 0 || check_comm(st, r, i, idx, err) < 0) return Step::Error;
  const bool fwd = a.op == PipeOp::SendForward || a.op == PipeOp::RecvForward;
  if (pipe_op_is_send(a.op)) {
    st.queues[{r, a.peer}].push_back({fwd, a.micro, a.chunk * st.s.p + r, st.clock[r]});
  } else {
    std::deque<Message>& q = st.queues[{a.peer, r}];
    if (q.empty()) return Step::Blocked;
    const Message msg = q.front();
    *err = mismatch(st, r, i, msg.forward, msg.micro, msg.stage);
    if (!err->empty()) return Step::Error;
    q.pop_front();
    st.clock[r] = std::max(st.clock[r], msg.time);
    (fwd ? st.fwd_input : st.bwd_input)[r][idx] = msg.time;
  }
  ++st.pc[r];
  return Step::Done;
}

// Rendezvous: pairs the posted sends from rank `from` to rank `to` with the posted receives, in
// posting order, as far as both queues go. Each match counts for both runs.
bool match(SimState& st, int from, int to, std::string* err) {
  std::deque<Posted>& sq = st.sends[{from, to}];
  std::deque<Posted>& rq = st.recvs[{from, to}];
  for (; !sq.empty() && !rq.empty(); sq.pop_front(), rq.pop_front()) {
    const Posted snd = sq.front(), rcv = rq.front();
    const PipeAction& a = st.s.ranks[from][snd.action];
    const bool fwd = a.op == PipeOp::SendForward;
    *err = mismatch(st, to, rcv.action, fwd, a.micro, a.chunk * st.s.p + from);
    if (!err->empty()) return false;
    const PipeAction& b = st.s.ranks[to][rcv.action];
    (fwd ? st.fwd_input : st.bwd_input)[to][b.chunk * st.s.m + b.micro] =
        std::max(snd.time, rcv.time);
    for (const auto& [mine, theirs] : {std::pair(snd, rcv), std::pair(rcv, snd)}) {
      st.matched[mine.rank][mine.action] = 1;
      --st.unmatched[mine.rank];
      st.partner_time[mine.rank] = std::max(st.partner_time[mine.rank], theirs.time);
    }
  }
  return true;
}

// Rendezvous: rank r reached a run of sends and receives. The first visit posts all of them at
// its clock; the run completes once every one is matched, at the latest post time on either end.
Step rendezvous(SimState& st, int r, std::string* err) {
  const auto [begin, end] = st.runs[r][st.run[r]];
  Step result = Step::Blocked;
  if (st.unmatched[r] < 0) {
    for (size_t i = begin; i < end; ++i) {
      const int idx = index_of(st, r, i, err);
      if (idx < 0 || check_comm(st, r, i, idx, err) < 0) return Step::Error;
    }
    st.unmatched[r] = (int)(end - begin);
    st.partner_time[r] = st.clock[r];
    for (size_t i = begin; i < end; ++i) {
      const PipeAction& a = st.s.ranks[r][i];
      const bool send = pipe_op_is_send(a.op);
      const std::pair<int, int> pair = send ? std::pair(r, a.peer) : std::pair(a.peer, r);
      (send ? st.sends : st.recvs)[pair].push_back({r, i, st.clock[r]});
      if (!match(st, pair.first, pair.second, err)) return Step::Error;
    }
    result = Step::Posted;
  }
  if (st.unmatched[r] > 0) return result;
  st.clock[r] = st.partner_time[r];
  st.unmatched[r] = -1;
  st.pc[r] = end;
  ++st.run[r];
  return Step::Done;
}

// A forward needs its input: the data (stage 0), a received activation, or the previous stage's
// output on this same rank (p = 1). A backward needs its own forward and its output gradient:
// the loss (last stage), a received gradient, or the next stage's on this rank.
Step compute(SimState& st, int r, double F, double B, PipelineSimulation& out, std::string* err) {
  const PipelineSchedule& s = st.s;
  const PipeAction& a = s.ranks[r][st.pc[r]];
  const int idx = index_of(st, r, st.pc[r], err);
  if (idx < 0) return Step::Error;
  const int S = s.p * s.v, stage = a.chunk * s.p + r, m = s.m;
  const bool fwd = a.op == PipeOp::Forward;
  const int from = fwd ? stage - 1 : stage + 1;
  bool has_input = from < 0 || from >= S || (fwd ? st.fwd_input : st.bwd_input)[r][idx] >= 0;
  if (!has_input && from % s.p == r)  // the neighbouring stage is on this rank
    has_input = (fwd ? st.fwd_done : st.bwd_done)[r][(from / s.p) * m + a.micro] >= 0;
  const char* broken = nullptr;
  if (!fwd && st.fwd_done[r][idx] < 0) broken = "backward before forward";
  else if (!has_input) broken = "its input was never received";
  else if ((fwd ? st.fwd_done : st.bwd_done)[r][idx] >= 0) broken = "twice";
  if (broken) {
    *err = describe(st, r, st.pc[r]) + ": " + broken;
    return Step::Error;
  }
  out.starts[r].push_back({st.clock[r], a});
  st.clock[r] += fwd ? F : B;
  out.busy[r] += fwd ? F : B;
  (fwd ? st.fwd_done : st.bwd_done)[r][idx] = st.clock[r];
  st.live[r] += fwd ? 1 : -1;
  out.peak_live[r] = std::max(out.peak_live[r], st.live[r]);
  ++st.pc[r];
  return Step::Done;
}

Step step(SimState& st, int r, double F, double B, PipelineSimulation& out, std::string* err) {
  if (!pipe_op_is_comm(st.s.ranks[r][st.pc[r]].op)) return compute(st, r, F, B, out, err);
  return st.mode == PipeComm::Buffered ? communicate(st, r, err) : rendezvous(st, r, err);
}

// The action rank r waits on: the next one, or under rendezvous the first unmatched one of the
// run it posted.
size_t waiting_on(const SimState& st, int r) {
  if (st.mode == PipeComm::Buffered || st.unmatched[r] <= 0) return st.pc[r];
  size_t i = st.pc[r];
  while (st.matched[r][i]) ++i;
  return i;
}

}  // namespace

// Runs every rank as far as it can, round after round, until all are done or none can move.
// Buffered, only receives block, and a message's time is fixed by its sender's order alone;
// rendezvous, a run ends at the latest post time of its operations and their partners, each fixed
// by its own rank's order. Either way the result does not depend on which rank the loop visits
// first.
PipelineSimulation pipeline_simulate(const PipelineSchedule& s, double F, double B,
                                     PipeComm mode) {
  const int p = s.p;
  PipelineSimulation out;
  out.busy.assign(p, 0.0);
  out.peak_live.assign(p, 0);
  out.starts.resize(p);
  SimState st(s, mode);
  for (;;) {
    bool moved = false, finished = true;
    for (int r = 0; r < p; ++r) {
      while (st.pc[r] < s.ranks[r].size()) {
        const Step result = step(st, r, F, B, out, &out.error);
        if (result == Step::Error) return out;
        moved = moved || result != Step::Blocked;
        if (result != Step::Done) break;
      }
      finished = finished && st.pc[r] == s.ranks[r].size();
    }
    if (finished) break;
    if (!moved) {
      out.error = "deadlock:";
      for (int r = 0; r < p; ++r)
        if (st.pc[r] < s.ranks[r].size()) out.error += " " + describe(st, r, waiting_on(st, r));
      return out;
    }
  }
  for (int r = 0; r < p; ++r) out.makespan = std::max(out.makespan, st.clock[r]);
  return out;
}

// ---------------------------------------------------------------------------------------------
// Placing the messages for rendezvous
// ---------------------------------------------------------------------------------------------
// The costs the placement is exact for: a chunk's backward takes twice its forward.
static const double kNominalF = 1, kNominalB = 2;

namespace {

// Gap j of a rank: the place in its list before its compute j (after compute j-1), where its run
// of sends and receives goes. In the nominal timeline the rank sits there from `begin` (compute
// j-1 ends) to `end` (compute j starts); the last gap, after the last compute, is a point.
struct Gap {
  double begin, end;
};

std::vector<Gap> gaps_of(const std::vector<std::pair<double, PipeAction>>& starts) {
  std::vector<Gap> gaps;
  double t = 0;
  for (const auto& [start, a] : starts) {
    gaps.push_back({t, start});
    t = start + (a.op == PipeOp::Forward ? kNominalF : kNominalB);
  }
  gaps.push_back({t, t});
  return gaps;
}

// The messages from rank a to rank b, in order: the k-th send of a to b (action sends[k]) goes
// with the k-th receive of b from a (action recvs[k]). at[r][i]: the gap of action i of rank r,
// updated here. The send goes to the first gap of a, from the one it is in now on, that overlaps
// some gap of b at or before the receive's present one; the receive to the latest such gap of b.
// A message never goes before the previous one, so both ends still post them in the same order.
void place_pair(const PipelineSchedule& s, int a, int b, const std::vector<size_t>& sends,
                const std::vector<size_t>& recvs, const std::vector<std::vector<Gap>>& gaps,
                std::vector<std::vector<int>>& at) {
  CHECK(sends.size() == recvs.size(), "pipeline %s p=%d m=%d v=%d: rank %d sends %zu messages to "
        "rank %d, which receives %zu", s.kind.c_str(), s.p, s.m, s.v, a, sends.size(), b,
        recvs.size());
  int first_x = 0, first_y = 0;  // the gaps of the previous message
  for (size_t k = 0; k < sends.size(); ++k) {
    const int from_x = std::max(at[a][sends[k]], first_x), from_y = at[b][recvs[k]];
    bool found = false;
    for (int x = from_x; !found && x < (int)gaps[a].size(); ++x) {
      if (gaps[a][x].begin > gaps[b][from_y].end) break;  // later gaps of a overlap nothing
      for (int y = from_y; !found && y >= first_y && gaps[b][y].end >= gaps[a][x].begin; --y)
        if (gaps[b][y].begin <= gaps[a][x].end) {
          at[a][sends[k]] = first_x = x;
          at[b][recvs[k]] = first_y = y;
          found = true;
        }
    }
    const PipeAction& msg = s.ranks[a][sends[k]];
    CHECK(found, "pipeline %s p=%d m=%d v=%d: rank %d and rank %d are never between computes at "
          "the same time for the %s of micro-batch %d (chunk %d): no place for it under "
          "rendezvous", s.kind.c_str(), s.p, s.m, s.v, a, b, msg.op == PipeOp::SendForward ?
          "activation" : "gradient", msg.micro, msg.chunk);
  }
}

// List r again: in each gap its sends, then its receives (each kind in its old order), then the
// compute. Sends first, as append() makes them: a send never waits for a receive of its own run.
std::vector<PipeAction> rebuild(const std::vector<PipeAction>& actions, const std::vector<int>& at,
                                size_t n_gaps) {
  std::vector<std::vector<PipeAction>> sends(n_gaps), recvs(n_gaps);
  std::vector<PipeAction> computes, out;
  for (size_t i = 0; i < actions.size(); ++i) {
    if (!pipe_op_is_comm(actions[i].op)) computes.push_back(actions[i]);
    else (pipe_op_is_send(actions[i].op) ? sends : recvs)[at[i]].push_back(actions[i]);
  }
  for (size_t j = 0; j < n_gaps; ++j) {
    out.insert(out.end(), sends[j].begin(), sends[j].end());
    out.insert(out.end(), recvs[j].begin(), recvs[j].end());
    if (j < computes.size()) out.push_back(computes[j]);
  }
  return out;
}

}  // namespace

// Under rendezvous a message goes when both ends have posted it, so they must post it while both
// are between computes at the same time, or one of them waits (or both, for ever: see the top of
// the file). The lists as append() makes them do so everywhere except on the link from the last
// rank back to rank 0 of the interleaved schedule: there the nominal timeline has each activation
// wait p*B and each gradient p*F between its send and its receive. This moves every message to a
// gap of its sender and a gap of its receiver that overlap in the nominal timeline, where all
// starts are whole numbers (such gaps were found for every configuration tried, p <= 16, m <= 64,
// v <= 6; place_pair stops the job if one is missing): the compute order, and every start time of
// the buffered simulation at those costs, stay as they were, and rendezvous gives the same times.
static void place_messages(PipelineSchedule& s) {
  const PipelineSimulation sim = pipeline_simulate(s, kNominalF, kNominalB);
  CHECK(sim.error.empty(), "pipeline %s p=%d m=%d v=%d: %s", s.kind.c_str(), s.p, s.m, s.v,
        sim.error.c_str());
  std::vector<std::vector<Gap>> gaps;
  std::vector<std::vector<int>> at(s.p);  // per rank and action: its gap
  std::map<std::pair<int, int>, std::pair<std::vector<size_t>, std::vector<size_t>>> msgs;
  for (int r = 0; r < s.p; ++r) {
    gaps.push_back(gaps_of(sim.starts[r]));
    int gap = 0;
    for (size_t i = 0; i < s.ranks[r].size(); ++i) {
      const PipeAction& a = s.ranks[r][i];
      at[r].push_back(gap);
      if (!pipe_op_is_comm(a.op)) ++gap;
      else if (pipe_op_is_send(a.op)) msgs[{r, a.peer}].first.push_back(i);
      else msgs[{a.peer, r}].second.push_back(i);
    }
  }
  for (const auto& [pair, ends] : msgs)
    place_pair(s, pair.first, pair.second, ends.first, ends.second, gaps, at);
  for (int r = 0; r < s.p; ++r) s.ranks[r] = rebuild(s.ranks[r], at[r], gaps[r].size());
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
