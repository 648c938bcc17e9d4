// parallel/pipeline_simulator.cu - runs the action lists of a pipeline schedule
// (parallel/pipeline_schedule.h) against each other, one clock per rank, with the costs of the
// compute actions (PipeCosts: F, B, W per chunk, or each action's measured duration) and free
// communication, and draws the result as an ASCII timeline. It checks what the executor relies
// on - every receive meets the message it expects, every compute has its input, no rank waits for
// ever - and measures the makespan, each rank's busy time and its peak of live activations. The
// planner (training/plan.cu), the executor's start-up (parallel/pipeline.cu), the measured
// step's report (pipeline_report.cu), the message placement (pipeline_messages.cu), a user's
// schedule's checks (pipeline_file.cu) and the tests (test/test_pipeline_headers.cpp draws the
// timelines in the headers of pipeline.cu and pipeline_schedule.cu with it) use it.
//
// The rules it runs by. A compute starts at its rank's clock once its input is there (the data on
// stage 0, a received activation or gradient, or the output of this rank's own neighbouring
// stage) and moves that clock by its cost. A W needs its own B; it sends and receives nothing.
// Sends and receives between two ranks match in posting order per channel (pipeline_channel:
// the activations of one chunk, or its gradients), one first-in first-out queue per ordered pair
// of ranks and channel, as MPI (by tag) and NCCL (per communicator) match them. When a send is
// done depends on the transport (PipeComm):
//
//   Buffered    the send completes at once and its message waits in its queue. A receive takes
//               the front message, which must be the one it expects, and the rank's clock moves
//               to the time it was sent. Only receives block. (MPI's eager small messages.)
//   Rendezvous  a rank reaching a run of sends and receives (pipeline_comm_runs) posts all of
//               them at its clock and stays there until every one is matched with its partner's
//               posted operation; the run then completes at the latest post time among them and
//               their partners. (NCCL always; MPI above its eager limit; how the executor runs.)
//
// Rendezvous is the stricter: a list that runs buffered deadlocks under it when two ranks each send
// to the other in a run of its own before the run with the receive (docs/PARALLELISM.md). A
// deadlock is reported as the cycle of ranks waiting for each other.
#include "parallel/pipeline_schedule.h"

#include <algorithm>
#include <cstdio>
#include <deque>
#include <map>
#include <tuple>

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

using Channel = std::tuple<int, int, int>;  // from rank, to rank, channel

// What the simulator tracks. Per rank r, chunk c, micro-batch i (index (c*m + i)): the time a
// forward / backward / weight pass finished and the time its input arrived (-1: not yet).
struct SimState {
  const PipelineSchedule& s;
  const PipeCosts& costs;
  PipeComm mode;
  std::vector<size_t> pc;     // per rank: index of the next action
  std::vector<size_t> done;   // per rank: compute actions done
  std::vector<double> clock;  // per rank: when the next action may start
  std::vector<int> live;
  std::vector<std::vector<double>> fwd_done, bwd_done, wgt_done, fwd_input, bwd_input;
  std::map<Channel, std::deque<Message>> queues;  // buffered
  // Rendezvous. Per rank: its runs of sends and receives (pipeline_comm_runs), the index of the
  // current one, how many of its operations still wait for a partner (-1: not posted yet), the
  // latest post time among the partners matched so far, and which actions are matched.
  std::vector<std::vector<std::pair<size_t, size_t>>> runs;
  std::vector<size_t> run;
  std::vector<int> unmatched;
  std::vector<double> partner_time;
  std::vector<std::vector<char>> matched;
  std::map<Channel, std::deque<Posted>> sends, recvs;

  SimState(const PipelineSchedule& sched, const PipeCosts& c, PipeComm comm)
      : s(sched), costs(c), mode(comm), pc(s.p, 0), done(s.p, 0), clock(s.p, 0.0), live(s.p, 0),
        run(s.p, 0), unmatched(s.p, -1), partner_time(s.p, 0.0) {
    const std::vector<double> unset(s.m * s.v, -1.0);
    for (auto* v : {&fwd_done, &bwd_done, &wgt_done, &fwd_input, &bwd_input}) v->assign(s.p, unset);
    for (const std::vector<PipeAction>& actions : s.ranks) {
      runs.push_back(pipeline_comm_runs(actions));
      matched.emplace_back(actions.size(), 0);
    }
  }
};

std::string describe(const SimState& st, int r, size_t i) {
  const PipeAction& a = st.s.ranks[r][i];
  char buf[200];
  std::snprintf(buf, sizeof(buf), "rank %d action %zu (%s micro %d chunk %d stage %d peer %d)", r,
                i, pipe_op_name(a.op), a.micro, a.chunk, st.s.stage(r, a.chunk), a.peer);
  std::string out = buf;
  if (a.line > 0) out = "line " + std::to_string(a.line) + ": " + out;
  return out;
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
  const int stage = s.stage(r, a.chunk), other = downstream ? stage + 1 : stage - 1;
  if (other < 0 || other >= s.p * s.v || s.owner(other) != a.peer) {
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

// The queue a send or receive of rank r goes to: (sender, receiver, channel).
Channel channel_of(const SimState& st, int r, const PipeAction& a) {
  const int c = pipeline_channel(st.s, r, a);
  return pipe_op_is_send(a.op) ? Channel{r, a.peer, c} : Channel{a.peer, r, c};
}

// "" if receive i of rank r expects this message (direction, micro-batch, sender's stage).
std::string mismatch(const SimState& st, int r, size_t i, bool forward, int micro, int stage) {
  const PipeAction& a = st.s.ranks[r][i];
  const int want = st.s.stage(r, a.chunk) + (a.op == PipeOp::RecvForward ? -1 : 1);
  if (forward == (a.op == PipeOp::RecvForward) && micro == a.micro && stage == want) return "";
  char buf[160];
  std::snprintf(buf, sizeof(buf), ": the next message from rank %d on its channel is %s micro %d "
                "of stage %d", a.peer, forward ? "activation" : "gradient", micro, stage);
  return describe(st, r, i) + buf;
}

// Buffered: a send completes at once; a receive takes the first message of its channel, which
// must be the one it expects. Fills *err on a broken rule.
Step communicate(SimState& st, int r, std::string* err) {
  const size_t i = st.pc[r];
  const PipeAction& a = st.s.ranks[r][i];
  const int idx = index_of(st, r, i, err);
  if (idx < 0 || check_comm(st, r, i, idx, err) < 0) return Step::Error;
  const bool fwd = pipe_op_is_forward_message(a.op);
  std::deque<Message>& q = st.queues[channel_of(st, r, a)];
  if (pipe_op_is_send(a.op)) {
    q.push_back({fwd, a.micro, st.s.stage(r, a.chunk), st.clock[r]});
  } else {
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

// Rendezvous: pairs the posted sends of a channel with its posted receives, in posting order, as
// far as both queues go. Each match counts for both runs.
bool match(SimState& st, const Channel& ch, std::string* err) {
  std::deque<Posted>& sq = st.sends[ch];
  std::deque<Posted>& rq = st.recvs[ch];
  const int from = std::get<0>(ch), to = std::get<1>(ch);
  for (; !sq.empty() && !rq.empty(); sq.pop_front(), rq.pop_front()) {
    const Posted snd = sq.front(), rcv = rq.front();
    const PipeAction& a = st.s.ranks[from][snd.action];
    const bool fwd = a.op == PipeOp::SendForward;
    *err = mismatch(st, to, rcv.action, fwd, a.micro, st.s.stage(from, a.chunk));
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
      const Channel ch = channel_of(st, r, a);
      (pipe_op_is_send(a.op) ? st.sends : st.recvs)[ch].push_back({r, i, st.clock[r]});
      if (!match(st, ch, err)) return Step::Error;
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

// The cost of rank r's next compute action a.
double cost_of(const SimState& st, int r, const PipeAction& a) {
  const PipeCosts& c = st.costs;
  if (!c.measured.empty()) return c.measured[r][st.done[r]];
  if (a.op == PipeOp::Forward) return c.F;
  if (a.op == PipeOp::Weight) return c.W;
  return st.s.split ? c.B : c.B + c.W;
}

// What is wrong with compute action a of rank r now, or nullptr. A forward needs its input: the
// data (stage 0), a received activation, or the previous stage's output on this same rank. A
// backward needs its own forward and its output gradient: the loss (last stage), a received
// gradient, or the next stage's on this rank. A W needs its B.
const char* compute_problem(const SimState& st, int r, const PipeAction& a, int idx) {
  const PipelineSchedule& s = st.s;
  const int S = s.p * s.v, stage = s.stage(r, a.chunk);
  if (a.op == PipeOp::Weight) {
    if (!s.split) return "a weight pass in a schedule that does not split backwards";
    if (st.bwd_done[r][idx] < 0) return "weight pass before its backward";
    if (st.wgt_done[r][idx] >= 0) return "twice";
    return nullptr;
  }
  const bool fwd = a.op == PipeOp::Forward;
  const int from = fwd ? stage - 1 : stage + 1;
  bool has_input = from < 0 || from >= S || (fwd ? st.fwd_input : st.bwd_input)[r][idx] >= 0;
  if (!has_input && s.owner(from) == r)  // the neighbouring stage is on this rank
    has_input = (fwd ? st.fwd_done : st.bwd_done)[r][s.chunk_of(from) * s.m + a.micro] >= 0;
  if (!fwd && st.fwd_done[r][idx] < 0) return "backward before forward";
  if (!has_input) return "its input was never received";
  if ((fwd ? st.fwd_done : st.bwd_done)[r][idx] >= 0) return "twice";
  return nullptr;
}

Step compute(SimState& st, int r, PipelineSimulation& out, std::string* err) {
  const PipeAction& a = st.s.ranks[r][st.pc[r]];
  const int idx = index_of(st, r, st.pc[r], err);
  if (idx < 0) return Step::Error;
  if (const char* broken = compute_problem(st, r, a, idx)) {
    *err = describe(st, r, st.pc[r]) + ": " + broken;
    return Step::Error;
  }
  const double cost = cost_of(st, r, a);
  out.starts[r].push_back({st.clock[r], a});
  st.clock[r] += cost;
  out.ends[r].push_back(st.clock[r]);
  out.busy[r] += cost;
  const bool frees = a.op == PipeOp::Weight || (a.op == PipeOp::Backward && !st.s.split);
  if (a.op == PipeOp::Forward) st.fwd_done[r][idx] = st.clock[r];
  if (a.op == PipeOp::Backward) st.bwd_done[r][idx] = st.clock[r];
  if (a.op == PipeOp::Weight) st.wgt_done[r][idx] = st.clock[r];
  st.live[r] += a.op == PipeOp::Forward ? 1 : frees ? -1 : 0;
  out.peak_live[r] = std::max(out.peak_live[r], st.live[r]);
  ++st.pc[r];
  ++st.done[r];
  return Step::Done;
}

Step step(SimState& st, int r, PipelineSimulation& out, std::string* err) {
  if (!pipe_op_is_comm(st.s.ranks[r][st.pc[r]].op)) return compute(st, r, out, err);
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

// No rank can move: follow "rank r waits for the peer of the action it waits on" from the first
// stuck rank until a rank repeats (the cycle) or a finished rank is reached.
std::string deadlock(const SimState& st) {
  const int p = st.s.p;
  std::vector<int> seen(p, -1), chain;
  int r = 0;
  while (r < p && st.pc[r] == st.s.ranks[r].size()) ++r;
  while (r >= 0 && r < p && seen[r] < 0 && st.pc[r] < st.s.ranks[r].size()) {
    seen[r] = (int)chain.size();
    chain.push_back(r);
    r = st.s.ranks[r][waiting_on(st, r)].peer;
  }
  std::string out = "deadlock:";
  const bool cycle = r >= 0 && r < p && seen[r] >= 0;
  if (cycle) out += " a cycle of ranks waiting for each other:";
  for (size_t k = cycle ? seen[r] : 0; k < chain.size(); ++k) {
    const int q = chain[k];
    out += (k > (cycle ? (size_t)seen[r] : 0) ? "; " : " ") + describe(st, q, waiting_on(st, q)) +
           " waits for rank " + std::to_string(st.s.ranks[q][waiting_on(st, q)].peer);
  }
  if (!cycle && r >= 0 && r < p) out += ", which has finished";
  return out;
}

}  // namespace

double PipelineSimulation::bubble() const {
  if (makespan <= 0) return 0;
  double mean = 0;
  for (double b : busy) mean += b / busy.size();
  return 1.0 - mean / makespan;
}

// Runs every rank as far as it can, round after round, until all are done or none can move.
// Buffered, only receives block, and a message's time is fixed by its sender's order alone;
// rendezvous, a run ends at the latest post time of its operations and their partners, each fixed
// by its own rank's order. Either way the result does not depend on which rank the loop visits
// first.
PipelineSimulation pipeline_simulate(const PipelineSchedule& s, const PipeCosts& costs,
                                     PipeComm mode) {
  const int p = s.p;
  PipelineSimulation out;
  out.busy.assign(p, 0.0);
  out.peak_live.assign(p, 0);
  out.starts.resize(p);
  out.ends.resize(p);
  SimState st(s, costs, mode);
  for (;;) {
    bool moved = false, finished = true;
    for (int r = 0; r < p; ++r) {
      while (st.pc[r] < s.ranks[r].size()) {
        const Step result = step(st, r, out, &out.error);
        if (result == Step::Error) return out;
        moved = moved || result != Step::Blocked;
        if (result != Step::Done) break;
      }
      finished = finished && st.pc[r] == s.ranks[r].size();
    }
    if (finished) break;
    if (!moved) {
      out.error = deadlock(st);
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
std::string pipeline_timeline(const PipelineSchedule& s, const PipelineSimulation& sim) {
  const int width = (int)sim.makespan;
  std::string text;
  for (int r = 0; r < s.p; ++r) {
    std::string line(2 * width, '.');
    for (size_t k = 0; k < sim.starts[r].size(); ++k) {
      const auto& [t, a] = sim.starts[r][k];
      const int begin = (int)t, units = (int)(sim.ends[r][k] - t);
      const char* letters = a.chunk > 0 ? "fbw" : "FBW";
      const char label[3] = {letters[(int)a.op], "0123456789abcdef"[a.micro % 16], 0};
      for (int u = 0; u < units && begin + u < width; ++u)
        line.replace(2 * (begin + u), 2, u == 0 ? label : "==");
    }
    text += "rank " + std::to_string(r) + " |" + line + "|\n";
  }
  return text;
}
