// test/test_pipeline_schedule.cpp - checks parallel/pipeline_schedule.h: the schedules, the message
// placement and the simulator (pure logic, one process).
//
// For every schedule and p in {1,2,3,4}, m in {1,2,4,8} (interleaved: v in {2,3} and the m that
// are multiples of p), the action lists pipeline_build makes, and their simulation with F = 1,
// B = 2 per chunk and free communication:
//  - every rank runs the forward and the backward of every (micro-batch, chunk) exactly once, so
//    every stage sees every micro-batch once each way, and each forward before its backward;
//  - sends match receives: for every ordered pair of ranks, the sends from one and the receives
//    on the other are the same sequence (direction, micro-batch, adjacent stages), in order, since
//    NCCL and MPI (tag 0) pair point-to-point messages per pair of ranks in posting order; and the
//    number of boundary messages is m*(p*v - 1) each way (0 on one rank);
//  - the simulation finishes without deadlock, mismatched message or missing input;
//  - peak live activations (chunk forwards held for their backward) of rank r equal the bound:
//    gpipe m; 1f1b min(p - r, m); interleaved min(w_r + 1, m*v) with w_r = (p-r-1) + (v-1)*p,
//    which is at most p*v chunk activations, i.e. p ranks' worth of layers, like 1f1b;
//  - makespan exactly (v*m + p - 1)*(F + B) and every rank busy m*v*(F + B): the bubble fraction
//    is (p-1)/(v*m + p-1) (v = 1 for gpipe and 1f1b);
//  - under rendezvous (a send completes only once its receive is posted, each run of sends and
//    receives as a whole: what NCCL and large MPI messages do) the simulation finishes too, at
//    F = 1, B = 2 and at F = B = 1, and at F = 1, B = 2 every compute starts exactly when it does
//    buffered: same makespan, busy time and peak live;
//  - the refused configurations, with their messages; and that the checks above catch a
//    deadlock, a mismatched message and a backward before its forward (broken lists), in both
//    modes, and a list that runs buffered but deadlocks under rendezvous; pipeline_comm_runs.
// Prints one line per check ("ok ..." or "FAIL ..."), the p=4 m=8 timelines, and exits 1 on any
// failure.
#include <cstdarg>
#include <cstdio>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "parallel/pipeline_schedule.h"
#include "test/check_results.h"

namespace {

const double kF = 1, kB = 2;

std::string name(const PipelineSchedule& s) {
  char buf[80];
  std::snprintf(buf, sizeof(buf), "%s p=%d m=%d v=%d", s.kind.c_str(), s.p, s.m, s.v);
  return buf;
}

// Each rank: forward and backward of every (micro, chunk) exactly once, forward first.
void check_compute(Results& res, const PipelineSchedule& s) {
  bool once = true, ordered = true;
  for (int r = 0; r < s.p; ++r) {
    std::map<std::pair<int, int>, std::pair<int, int>> seen;  // (micro, chunk) -> (#F, #B)
    for (const PipeAction& a : s.ranks[r]) {
      auto& n = seen[{a.micro, a.chunk}];
      if (a.op == PipeOp::Forward) n.first++;
      if (a.op == PipeOp::Backward) {
        n.second++;
        ordered = ordered && n.first == 1;
      }
    }
    for (int i = 0; i < s.m; ++i)
      for (int c = 0; c < s.v; ++c) {
        auto it = seen.find({i, c});
        once = once && it != seen.end() && it->second == std::make_pair(1, 1);
      }
    once = once && seen.size() == (size_t)(s.m * s.v);
  }
  res.check(once, "%s: every stage runs every micro-batch once forward and once backward",
            name(s).c_str());
  res.check(ordered, "%s: every forward precedes its backward on its rank", name(s).c_str());
}

// One boundary message as both ends see it: direction, micro-batch, sender's and receiver's stage.
struct Msg {
  bool forward;
  int micro, from_stage, to_stage;
  bool operator==(const Msg& o) const {
    return forward == o.forward && micro == o.micro && from_stage == o.from_stage &&
           to_stage == o.to_stage;
  }
};

void check_messages(Results& res, const PipelineSchedule& s) {
  std::map<std::pair<int, int>, std::vector<Msg>> sent, received;  // (from rank, to rank)
  int n_fwd = 0, n_bwd = 0;
  for (int r = 0; r < s.p; ++r)
    for (const PipeAction& a : s.ranks[r]) {
      const int stage = a.chunk * s.p + r;
      const bool fwd = a.op == PipeOp::SendForward || a.op == PipeOp::RecvForward;
      const bool downstream = a.op == PipeOp::SendForward || a.op == PipeOp::RecvBackward;
      const int other = downstream ? stage + 1 : stage - 1;
      if (a.op == PipeOp::SendForward || a.op == PipeOp::SendBackward) {
        sent[{r, a.peer}].push_back({fwd, a.micro, stage, other});
        (fwd ? n_fwd : n_bwd)++;
      } else if (a.op == PipeOp::RecvForward || a.op == PipeOp::RecvBackward) {
        received[{a.peer, r}].push_back({fwd, a.micro, other, stage});
      }
    }
  bool match = sent.size() == received.size(), peers = true;
  for (const auto& [pair, msgs] : sent) {
    match = match && received.count(pair) && received[pair] == msgs;
    for (const Msg& m : msgs)  // the peers hold the stages named
      peers = peers && m.from_stage % s.p == pair.first && m.to_stage % s.p == pair.second &&
              m.to_stage >= 0 && m.to_stage < s.p * s.v;
  }
  res.check(match && peers, "%s: sends and receives match per pair of ranks, in order",
            name(s).c_str());
  const int want = s.p > 1 ? s.m * (s.p * s.v - 1) : 0;
  res.check(n_fwd == want && n_bwd == want, "%s: %d activations and %d gradients cross stage "
            "boundaries (want %d each)", name(s).c_str(), n_fwd, n_bwd, want);
}

int live_bound(const PipelineSchedule& s, int r) {
  if (s.kind == "gpipe") return s.m;
  if (s.kind == "1f1b") return std::min(s.p - r, s.m);
  return std::min((s.p - r - 1) + (s.v - 1) * s.p + 1, s.m * s.v);
}

void check_simulation(Results& res, const PipelineSchedule& s) {
  const PipelineSimulation sim = pipeline_simulate(s, kF, kB);
  res.check(sim.error.empty(), "%s: simulation runs to the end%s%s", name(s).c_str(),
            sim.error.empty() ? "" : ": ", sim.error.c_str());
  if (!sim.error.empty()) return;
  bool live_ok = true, busy_ok = true;
  std::string live = "";
  for (int r = 0; r < s.p; ++r) {
    live_ok = live_ok && sim.peak_live[r] == live_bound(s, r) &&
              (s.kind == "gpipe" || sim.peak_live[r] <= s.p * s.v);
    busy_ok = busy_ok && sim.busy[r] == s.m * s.v * (kF + kB);
    live += (r ? "," : "") + std::to_string(sim.peak_live[r]);
  }
  res.check(live_ok, "%s: peak live activations per rank %s equal the bound", name(s).c_str(),
            live.c_str());
  const double want = (s.v * s.m + s.p - 1) * (kF + kB);
  res.check(sim.makespan == want && busy_ok,
            "%s: makespan %g (want (v*m+p-1)*(F+B) = %g), bubble %.3f = (p-1)/(v*m+p-1)",
            name(s).c_str(), sim.makespan, want, 1 - s.m * s.v * (kF + kB) / sim.makespan);
}

// Rendezvous: a send completes only once its receive is posted, and each run of sends and
// receives completes as a whole. The lists run to the end at any costs (whether they get stuck
// depends on the order alone; F = B = 1 checks a second ratio), and at F = 1, B = 2 every compute
// starts exactly when it does buffered, since pipeline_build posts each message where both ends
// are between computes at the same moment of that timeline: same makespan, busy and peak live.
void check_rendezvous(Results& res, const PipelineSchedule& s) {
  const PipelineSimulation buffered = pipeline_simulate(s, kF, kB);
  const PipelineSimulation sim = pipeline_simulate(s, kF, kB, PipeComm::Rendezvous);
  res.check(sim.error.empty(), "%s: rendezvous simulation runs to the end%s%s", name(s).c_str(),
            sim.error.empty() ? "" : ": ", sim.error.c_str());
  const std::string other = pipeline_simulate(s, 1, 1, PipeComm::Rendezvous).error;
  res.check(other.empty(), "%s: and at F = B = 1%s%s", name(s).c_str(), other.empty() ? "" : ": ",
            other.c_str());
  if (!sim.error.empty() || !buffered.error.empty()) return;
  bool same_starts = true;
  for (int r = 0; r < s.p; ++r) {
    same_starts = same_starts && sim.starts[r].size() == buffered.starts[r].size();
    for (size_t i = 0; same_starts && i < sim.starts[r].size(); ++i) {
      const auto& [t, a] = sim.starts[r][i];
      const auto& [tb, b] = buffered.starts[r][i];
      same_starts = t == tb && a.op == b.op && a.micro == b.micro && a.chunk == b.chunk;
    }
  }
  res.check(sim.makespan == buffered.makespan && sim.busy == buffered.busy &&
                sim.peak_live == buffered.peak_live && same_starts,
            "%s: rendezvous makespan %g = buffered %g, every compute starts at the same time, "
            "same busy time and peak live", name(s).c_str(), sim.makespan, buffered.makespan);
}

void check_schedule(Results& res, const std::string& kind, int p, int m, int v) {
  const PipelineSchedule s = pipeline_build(kind, p, m, v);
  check_compute(res, s);
  check_messages(res, s);
  check_simulation(res, s);
  check_rendezvous(res, s);
}

void check_refused(Results& res) {
  const struct {
    const char* kind;
    int p, m, v, n_layer;
    const char* want;
  } cases[] = {
      {"1f1b", 4, 8, 1, 12, ""},
      {"interleaved", 4, 8, 2, 16, ""},
      {"zb-h1", 2, 4, 1, 0, "pipeline: schedule \"zb-h1\" is unknown (one of \"gpipe\", \"1f1b\", "
                            "\"interleaved\")"},
      {"1f1b", 2, 4, 2, 0, "pipeline: v = 2 chunks per rank needs the \"interleaved\" schedule "
                           "(\"1f1b\" runs one chunk per rank)"},
      {"interleaved", 3, 6, 1, 0, "pipeline: the \"interleaved\" schedule needs v >= 2 chunks "
                                  "per rank (with one chunk per rank it is \"1f1b\")"},
      {"interleaved", 2, 4, 2, 0, "pipeline: the \"interleaved\" schedule needs pp >= 3, not 2 "
                                  "(at pp = 2 the activations and the gradients between the two "
                                  "ranks share one ordered channel and would have to interleave "
                                  "in the same order on both ends)"},
      {"interleaved", 4, 6, 2, 0, "pipeline: the \"interleaved\" schedule needs the micro-batches "
                                  "m = 6 to be a multiple of pp = 4 (they go through each chunk "
                                  "in groups of pp)"},
      {"interleaved", 4, 2, 2, 0, "pipeline: the \"interleaved\" schedule needs the micro-batches "
                                  "m = 2 to be a multiple of pp = 4 (they go through each chunk "
                                  "in groups of pp)"},
      {"1f1b", 4, 8, 1, 6, "pipeline: n_layer = 6 is not a multiple of pp*v = 4*1 = 4 (each of "
                           "the pp*v stages holds the same number of blocks)"},
      {"gpipe", 0, 8, 1, 0, "pipeline: pp = 0, micro-batches m = 8 and virtual chunks v = 1 must "
                            "each be at least 1"},
  };
  for (const auto& c : cases) {
    const std::string got = pipeline_rules(c.kind, c.p, c.m, c.v, c.n_layer);
    const bool ok = got == c.want;
    res.check(ok, "validate %s p=%d m=%d v=%d n_layer=%d: \"%s\"%s%s", c.kind, c.p, c.m, c.v,
              c.n_layer, got.c_str(), ok ? "" : " want ", ok ? "" : c.want);
  }
}

// One rank's list of a two-rank pipeline (v = 1) from text: "F3" and "B3" are the forward and
// backward of micro-batch 3, "sf3", "rf3", "sb3", "rb3" its send-fwd, recv-fwd, send-bwd and
// recv-bwd, with the other rank.
std::vector<PipeAction> two_rank_list(int rank, const std::string& text) {
  const std::map<std::string, PipeOp> ops = {
      {"F", PipeOp::Forward},       {"B", PipeOp::Backward},      {"sf", PipeOp::SendForward},
      {"rf", PipeOp::RecvForward}, {"sb", PipeOp::SendBackward}, {"rb", PipeOp::RecvBackward}};
  std::vector<PipeAction> out;
  std::istringstream words(text);
  for (std::string w; words >> w;) {
    const size_t digit = w.find_first_of("0123456789");
    const PipeOp op = ops.at(w.substr(0, digit));
    out.push_back({op, std::stoi(w.substr(digit)), 0, pipe_op_is_comm(op) ? 1 - rank : -1});
  }
  return out;
}

// The checks above must see broken lists, in both modes: a send moved after the receive waiting
// for it (a deadlock buffered; under rendezvous the two share a run, are posted together, and the
// list runs), two receives swapped (mismatch), a backward before its forward; and a list that runs
// buffered but not under rendezvous: rank 0 sends micro-batch 2's activation in a run of its own
// and receives micro-batch 0's gradient only after F3, rank 1 sends that gradient in a run of its
// own and receives micro-batch 2's activation only after B1. Each send waits for a receive that
// the other rank posts after its own send has completed.
void check_checkers(Results& res) {
  const PipeComm modes[] = {PipeComm::Buffered, PipeComm::Rendezvous};
  PipelineSchedule dead = pipeline_build("1f1b", 2, 1, 1);  // rank 0: F0 send-fwd0 recv-bwd0 B0
  std::swap(dead.ranks[0][1], dead.ranks[0][2]);
  std::string err = pipeline_simulate(dead, kF, kB).error;
  res.check(err.rfind("deadlock:", 0) == 0, "a send after the receive that waits for it: %s",
            err.c_str());
  err = pipeline_simulate(dead, kF, kB, PipeComm::Rendezvous).error;
  res.check(err.empty(), "the same, in one run under rendezvous: runs to the end%s%s",
            err.empty() ? "" : ": ", err.c_str());
  PipelineSchedule swapped = pipeline_build("1f1b", 2, 2, 1);  // rank 1 gets micro-batch 1 first
  std::vector<PipeAction>& r1 = swapped.ranks[1];
  std::swap(r1[0], r1[4]);
  PipelineSchedule backward_first = pipeline_build("1f1b", 1, 2, 1);  // F0 B0 F1 B1
  std::swap(backward_first.ranks[0][2], backward_first.ranks[0][3]);
  for (PipeComm mode : modes) {
    const char* how = mode == PipeComm::Buffered ? "buffered" : "rendezvous";
    err = pipeline_simulate(swapped, kF, kB, mode).error;
    res.check(err == "rank 1 action 0 (recv-fwd micro 1 chunk 0 stage 1 peer 0): the next message "
                     "from rank 0 is activation micro 0 of stage 0",
              "receives out of order, %s: %s", how, err.c_str());
    err = pipeline_simulate(backward_first, kF, kB, mode).error;
    res.check(err.find("backward before forward") != std::string::npos,
              "a backward before its forward, %s: %s", how, err.c_str());
  }
  PipelineSchedule cross;
  cross.kind = "by hand", cross.p = 2, cross.m = 4;
  cross.ranks = {two_rank_list(0, "F0 sf0 F1 sf1 F2 sf2 F3 sf3 rb0 B0 rb1 B1 rb2 B2 rb3 B3"),
                 two_rank_list(1, "rf0 F0 rf1 F1 B0 sb0 B1 sb1 rf2 F2 B2 sb2 rf3 F3 B3 sb3")};
  const PipelineSimulation buffered = pipeline_simulate(cross, kF, kB);
  res.check(buffered.error.empty() && buffered.makespan == 15,
            "both ranks sending first, buffered: runs to the end in %g (want (m+p-1)*(F+B) = "
            "15)%s%s",
            buffered.makespan, buffered.error.empty() ? "" : ": ", buffered.error.c_str());
  err = pipeline_simulate(cross, kF, kB, PipeComm::Rendezvous).error;
  res.check(err == "deadlock: rank 0 action 5 (send-fwd micro 2 chunk 0 stage 0 peer 1) rank 1 "
                   "action 5 (send-bwd micro 0 chunk 0 stage 1 peer 0)",
            "both ranks sending first, rendezvous: %s", err.c_str());
}

// pipeline_comm_runs: the runs of consecutive sends and receives, as [begin, end).
void check_comm_runs(Results& res) {
  const std::vector<PipeAction> list = two_rank_list(1, "rf0 F0 B0 sb0 rf1 F1 B1 sb1");
  const std::vector<std::pair<size_t, size_t>> want = {{0, 1}, {3, 5}, {7, 8}};
  res.check(pipeline_comm_runs(list) == want, "comm runs of rf0 F0 B0 sb0 rf1 F1 B1 sb1: "
            "[0,1) [3,5) [7,8)");
  res.check(pipeline_comm_runs(two_rank_list(0, "F0 B0")).empty(), "no comm runs in F0 B0");
}

}  // namespace

int main() {
  Results res;
  const int ps[] = {1, 2, 3, 4}, ms[] = {1, 2, 4, 8};
  for (int p : ps)
    for (int m : ms) {
      check_schedule(res, "gpipe", p, m, 1);
      check_schedule(res, "1f1b", p, m, 1);
    }
  for (int p : ps)  // interleaved: the allowed (p, m), and m = 3, 6, 12 so that p = 3 gets some
    for (int m : {1, 2, 3, 4, 6, 8, 12})
      for (int v : {2, 3})
        if (pipeline_rules("interleaved", p, m, v, 0).empty())
          check_schedule(res, "interleaved", p, m, v);
  check_refused(res);
  check_checkers(res);
  check_comm_runs(res);
  for (const char* kind : {"gpipe", "1f1b", "interleaved"}) {
    const int v = std::string(kind) == "interleaved" ? 2 : 1;
    const PipelineSchedule s = pipeline_build(kind, 4, 8, v);
    const PipelineSimulation sim = pipeline_simulate(s, kF, kB);
    const double rdv = pipeline_simulate(s, kF, kB, PipeComm::Rendezvous).makespan;
    std::printf("\n%s, p=4 m=8 v=%d, F=1 B=2 per chunk, makespan %g (rendezvous %g):\n%s", kind,
                v, sim.makespan, rdv, pipeline_timeline(s, sim, kF, kB).c_str());
  }
  std::printf("\ntest_pipeline_schedule: %d of %d checks failed\n", res.failures, res.checks);
  return res.failures ? 1 : 0;
}
