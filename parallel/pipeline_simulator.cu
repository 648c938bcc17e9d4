// parallel/pipeline_simulator.cu - runs the action lists of a pipeline schedule
// (parallel/pipeline_schedule.h) against each other, one clock per rank, with compute costs F and
// B per chunk and free communication, and draws the result as an ASCII timeline. It checks what
// the executor relies on - every receive meets the message it expects, every compute has its
// input, no rank waits for ever - and measures the makespan, each rank's busy time and its peak
// of live activations. The planner (training/plan.cu), the executor's start-up
// (parallel/pipeline.cu), the message placement (pipeline_messages.cu) and the tests use it.
//
// The rules it runs by. A compute starts at its rank's clock once its input is there (the data on
// stage 0, a received activation or gradient, or the output of this rank's own neighbouring
// stage when p = 1) and moves that clock by F or B. Sends and receives between two ranks match
// in posting order, one first-in first-out channel per ordered pair of ranks, as NCCL and MPI
// (tag 0) match them. When a send is done depends on the transport (PipeComm):
//
//   Buffered    the send completes at once and its message waits in the channel. A receive takes
//               the front message, which must be the one it expects, and the rank's clock moves
//               to the time it was sent. Only receives block. (MPI's eager small messages.)
//   Rendezvous  a rank reaching a run of sends and receives (pipeline_comm_runs) posts all of
//               them at its clock and stays there until every one is matched with its partner's
//               posted operation; the run then completes at the latest post time among them and
//               their partners. (NCCL always; MPI above its eager limit; how the executor runs.)
//
// Rendezvous is the stricter: a list that runs buffered deadlocks under it when two ranks each send
// to the other in a run of its own before the run with the receive (docs/PARALLELISM.md).
#include "parallel/pipeline_schedule.h"

#include <algorithm>
#include <cstdio>
#include <deque>
#include <map>

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
// Timeline
// ---------------------------------------------------------------------------------------------
// Two characters per time unit: the label at a compute's first unit, "==" for the rest.
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
