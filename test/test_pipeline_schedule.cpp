// test/test_pipeline_schedule.cpp - checks parallel/pipeline_schedule.h: the schedules, the message
// placement and the simulator (pure logic, one process). A user's schedule files are
// test/test_pipeline_file.cpp's.
//
// For every schedule and p in {1,2,3,4}, m in {1,2,3,4,6,8,12} (interleaved: v in {2,3} and the m
// that are multiples of p; zb-v: v = 2), the action lists pipeline_build makes, and their
// simulation at the nominal costs F = B = W = 1 per chunk (an unsplit backward costs 2):
//  - every rank runs the forward and the backward of every (micro-batch, chunk) exactly once, and
//    in a split schedule (zb-h1, zb-v) its weight pass W once, in that order; unsplit ones have no
//    W;
//  - sends match receives: for every ordered pair of ranks and channel (the activations of one
//    chunk, the gradients of one chunk), the sends from one and the receives on the other are the
//    same sequence (direction, micro-batch, adjacent stages), in order, since MPI (by tag) and
//    NCCL (per communicator) pair point-to-point messages so; and the number of boundary messages
//    is m*(p*v - 1) each way (0 on one rank);
//  - the simulation finishes without deadlock, mismatched message or missing input;
//  - peak live activations of rank r (chunk forwards whose backward - weight pass when split - has
//    not run) equal the schedule's formula (pipeline_peak_formula), and so do the executor's
//    activation slots (pipeline_slots), which also count receives placed early;
//  - the residual-gradient buffers (pipeline_grad_buffers) at most the slots + 1, at most 2 on
//    1f1b and zb-h1, 1 on 1f1b's rank 0, m on gpipe's last rank (check_grad_buffers);
//  - the bubble 1 - busy/makespan equals the formula (pipeline_schedule_bubble) exactly, and every
//    rank is busy m*v*3;
//  - zb-h1 at m >= p and other costs (F, B, W in {1,2,3}^3): makespan m(F+B+W) +
//    (p-1) max(F+B-W, B); zb-v at m >= 2p-1 and chunk costs with F <= B, W <= B: 2m(F+B+W) +
//    (p-1) max(B, 2(B-W)); at m >= p zb-h1's bubble time is a third of 1f1b's, zb-v's a sixth;
//  - under rendezvous (a send completes only once its receive is posted, each run of sends and
//    receives as a whole: what NCCL and large MPI messages do) the simulation finishes too, at
//    the nominal costs and at F = 2, B = 1, W = 1, and at the nominal costs every compute starts
//    exactly when it does buffered: same makespan, busy time and peak live;
//  - at p = 2 every schedule runs, interleaving included, because messages match per channel: a
//    list pair that needs the channels (one send order, another receive order across two
//    channels) runs, and deadlocks when all messages share one channel;
//  - the refused configurations, with their messages; that the checks catch a deadlock (named as
//    the cycle of ranks), a mismatched message, a backward before its forward and a weight pass
//    before its backward (broken lists), in both modes, and a list that runs buffered but
//    deadlocks under rendezvous; pipeline_comm_runs; the stage orders; and that a simulation
//    with measured per-action durations gives the measured makespan back.
// Prints one line per check ("ok ..." or "FAIL ..."), the p=4 m=8 timelines, and exits 1 on any
// failure.
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "parallel/pipeline.h"
#include "parallel/pipeline_schedule.h"
#include "test/check_results.h"

namespace {

const PipeCosts kNominal{};

std::string name(const PipelineSchedule& s) {
  char buf[80];
  std::snprintf(buf, sizeof(buf), "%s p=%d m=%d v=%d", s.kind.c_str(), s.p, s.m, s.v);
  return buf;
}

// Each rank: F, B (and W when split) of every (micro, chunk) exactly once, in that order.
void check_compute(Results& res, const PipelineSchedule& s) {
  bool once = true, ordered = true;
  const int want_w = s.split ? 1 : 0;
  for (int r = 0; r < s.p; ++r) {
    std::map<std::pair<int, int>, std::tuple<int, int, int>> seen;  // (micro, chunk) -> #F #B #W
    for (const PipeAction& a : s.ranks[r]) {
      auto& [f, b, w] = seen[{a.micro, a.chunk}];
      if (a.op == PipeOp::Forward) f++;
      if (a.op == PipeOp::Backward) ordered = ordered && f == 1 && b++ == 0;
      if (a.op == PipeOp::Weight) ordered = ordered && b == 1 && w++ == 0;
    }
    for (int i = 0; i < s.m; ++i)
      for (int c = 0; c < s.v; ++c) {
        auto it = seen.find({i, c});
        once = once && it != seen.end() && it->second == std::make_tuple(1, 1, want_w);
      }
    once = once && seen.size() == (size_t)(s.m * s.v);
  }
  res.check(once, "%s: every stage runs every micro-batch once forward, once backward%s",
            name(s).c_str(), s.split ? " and once weight pass" : " (no weight pass)");
  res.check(ordered, "%s: forward before backward%s on its rank", name(s).c_str(),
            s.split ? " before weight pass" : "");
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
  // (from rank, to rank, channel) -> messages in posting order
  std::map<std::tuple<int, int, int>, std::vector<Msg>> sent, received;
  int n_fwd = 0, n_bwd = 0;
  for (int r = 0; r < s.p; ++r)
    for (const PipeAction& a : s.ranks[r]) {
      if (!pipe_op_is_comm(a.op)) continue;
      const int stage = s.stage(r, a.chunk), c = pipeline_channel(s, r, a);
      const bool fwd = pipe_op_is_forward_message(a.op);
      const bool downstream = a.op == PipeOp::SendForward || a.op == PipeOp::RecvBackward;
      const int other = downstream ? stage + 1 : stage - 1;
      if (pipe_op_is_send(a.op)) {
        sent[{r, a.peer, c}].push_back({fwd, a.micro, stage, other});
        (fwd ? n_fwd : n_bwd)++;
      } else {
        received[{a.peer, r, c}].push_back({fwd, a.micro, other, stage});
      }
    }
  bool match = sent.size() == received.size(), peers = true;
  for (const auto& [key, msgs] : sent) {
    match = match && received.count(key) && received[key] == msgs;
    for (const Msg& m : msgs)  // the peers hold the stages named
      peers = peers && s.owner(m.from_stage) == std::get<0>(key) &&
              s.owner(m.to_stage) == std::get<1>(key) && m.to_stage >= 0 &&
              m.to_stage < s.p * s.v;
  }
  res.check(match && peers, "%s: sends and receives match per pair of ranks and channel, in "
            "order", name(s).c_str());
  int want = 0;  // the stage boundaries that cross ranks, once per micro-batch
  for (int st = 0; st + 1 < s.p * s.v; ++st) want += s.owner(st) != s.owner(st + 1) ? s.m : 0;
  res.check(n_fwd == want && n_bwd == want && want == (s.p > 1 ? s.m * (s.p * s.v - 1) -
            (s.order == StageOrder::V ? s.m : 0) : 0),
            "%s: %d activations and %d gradients cross stage boundaries (want %d each)",
            name(s).c_str(), n_fwd, n_bwd, want);
}

// The residual-gradient buffers (pipeline_grad_buffers, a pool apart from the slots): a
// gradient lives from its receive (or the last stage's forward) to its send (or stage 0's
// backward, or weight pass when split), so never more than the slots plus one (the receive of
// a run of messages posted with the send that frees a buffer), and on a schedule that runs each
// backward right after its gradient arrives (1f1b, interleaved, zb-h1: every rank but the last
// stage's) at most 2; the last stage of gpipe holds all m (every forward's head writes one).
void check_grad_buffers(Results& res, const PipelineSchedule& s) {
  bool ok = true;
  std::string got;
  for (int r = 0; r < s.p; ++r) {
    const int g = pipeline_grad_buffers(s, r), slots = pipeline_slots(s, r);
    ok = ok && g >= 1 && g <= slots + 1;
    if (s.kind == "1f1b" || s.kind == "zb-h1") ok = ok && g <= 2;
    if (s.kind == "gpipe" && r == s.p - 1) ok = ok && g == s.m;
    if (s.kind == "1f1b" && r == 0 && s.p > 1) ok = ok && g == 1;
    got += (r ? "," : "") + std::to_string(g);
  }
  res.check(ok, "%s: gradient buffers %s per rank", name(s).c_str(), got.c_str());
}

void check_simulation(Results& res, const PipelineSchedule& s) {
  const PipelineSimulation sim = pipeline_simulate(s, kNominal);
  res.check(sim.error.empty(), "%s: simulation runs to the end%s%s", name(s).c_str(),
            sim.error.empty() ? "" : ": ", sim.error.c_str());
  if (!sim.error.empty()) return;
  bool live_ok = true, slots_ok = true, busy_ok = true;
  std::string live, slots;
  for (int r = 0; r < s.p; ++r) {
    const int want = pipeline_peak_formula(s.kind, s.p, s.m, s.v, r);
    live_ok = live_ok && sim.peak_live[r] == want;
    // The executor's slots also hold what the placement receives early or sends late: nothing
    // for gpipe, 1f1b and zb-h1; at most one gradient waiting for its busy receiver in zb-v;
    // the early receives from rank p-1 on the interleaved schedule's rank 0 (floor(log2 p)).
    int extra = 0;
    if (s.kind == "zb-v") extra = 1;
    if (s.kind == "interleaved" && r == 0) extra = (int)std::floor(std::log2(s.p));
    const int got = pipeline_slots(s, r);
    slots_ok = slots_ok && got >= want && got <= want + extra;
    busy_ok = busy_ok && sim.busy[r] == s.m * s.v * 3.0;
    live += (r ? "," : "") + std::to_string(sim.peak_live[r]);
    slots += (r ? "," : "") + std::to_string(pipeline_slots(s, r));
  }
  res.check(live_ok && slots_ok, "%s: peak live activations %s per rank equal the formula, "
            "slots %s (formula + what the placement holds)", name(s).c_str(), live.c_str(),
            slots.c_str());
  check_grad_buffers(res, s);
  const double want = pipeline_schedule_bubble(s.kind, s.p, s.m, s.v);
  res.check(std::fabs(sim.bubble() - want) < 1e-12 && busy_ok,
            "%s: makespan %g, bubble %.4f = the formula's %.4f", name(s).c_str(), sim.makespan,
            sim.bubble(), want);
}

// Rendezvous: the lists run to the end at other costs too (whether they get stuck depends on the
// order alone), and at the nominal costs every compute starts exactly when it does buffered,
// since pipeline_build posts each message where both ends are between computes at the same
// moment of that timeline.
void check_rendezvous(Results& res, const PipelineSchedule& s) {
  const PipelineSimulation buffered = pipeline_simulate(s, kNominal);
  const PipelineSimulation sim = pipeline_simulate(s, kNominal, PipeComm::Rendezvous);
  res.check(sim.error.empty(), "%s: rendezvous simulation runs to the end%s%s", name(s).c_str(),
            sim.error.empty() ? "" : ": ", sim.error.c_str());
  const std::string other = pipeline_simulate(s, {2, 1, 1, {}}, PipeComm::Rendezvous).error;
  res.check(other.empty(), "%s: and at F = 2, B = W = 1%s%s", name(s).c_str(),
            other.empty() ? "" : ": ", other.c_str());
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

// The lists of s with each message right before or after its compute, as pipeline_build makes
// them before placing them: the compute order alone. (The placed lists keep every start time at
// the nominal costs; at others a receive placed early can make its rank wait sooner.)
PipelineSchedule unplaced(const PipelineSchedule& s) {
  PipelineSchedule u = s;
  for (int r = 0; r < s.p; ++r) {
    std::vector<PipeAction> computes;
    for (const PipeAction& a : s.ranks[r])
      if (!pipe_op_is_comm(a.op)) computes.push_back(a);
    u.ranks[r] = pipeline_with_messages(s, r, computes);
  }
  return u;
}

// The zero-bubble schedules' makespans at other costs (their compute orders, buffered), where
// their formulas hold.
void check_cost_formulas(Results& res) {
  int h1_cases = 0, h1_bad = 0, v_cases = 0, v_bad = 0;
  for (int p : {2, 3, 4, 5})
    for (int F = 1; F <= 3; ++F)
      for (int B = 1; B <= 3; ++B)
        for (int W = 1; W <= 3; ++W) {
          for (int m : {p, p + 1, 2 * p + 1}) {
            const double got = pipeline_simulate(unplaced(pipeline_build("zb-h1", p, m, 1)),
                                                 {(double)F, (double)B, (double)W, {}})
                                   .makespan;
            const double want = m * (F + B + W) + (p - 1) * std::max({F + B - W, F, B});
            h1_cases++, h1_bad += got != want;
            if (got != want)
              std::printf("  zb-h1 p=%d m=%d F=%d B=%d W=%d: %g, want %g\n", p, m, F, B, W, got,
                          want);
          }
          if (F > B || W > B) continue;
          for (int m : {2 * p - 1, 2 * p, 3 * p + 1}) {
            const double got = pipeline_simulate(unplaced(pipeline_build("zb-v", p, m, 2)),
                                                 {(double)F, (double)B, (double)W, {}})
                                   .makespan;
            const double want = 2 * m * (F + B + W) + (p - 1) * std::max(B, 2 * (B - W));
            v_cases++, v_bad += got != want;
            if (got != want)
              std::printf("  zb-v p=%d m=%d F=%d B=%d W=%d: %g, want %g\n", p, m, F, B, W, got,
                          want);
          }
        }
  res.check(h1_bad == 0, "zb-h1 at m >= p, F, B, W in 1..3: makespan m(F+B+W) + (p-1) "
            "max(F+B-W, F, B) in all %d cases", h1_cases);
  res.check(v_bad == 0, "zb-v at m >= 2p-1, F <= B, W <= B: makespan 2m(F+B+W) + (p-1) "
            "max(B, 2(B-W)) in all %d cases", v_cases);
  // The bubble time against 1f1b's on the same model, at the nominal costs.
  const int p = 4, m = 16;
  const double one = pipeline_simulate(pipeline_build("1f1b", p, m, 1), kNominal).makespan;
  const double h1 = pipeline_simulate(pipeline_build("zb-h1", p, m, 1), kNominal).makespan;
  const double zv = pipeline_simulate(pipeline_build("zb-v", p, m, 2), kNominal).makespan;
  res.check(one - 3 * m == 3 * (h1 - 3 * m) && (one - 3 * m) * 2 == 6 * (zv - 6 * m),
            "p=4 m=16: bubble time 1f1b %g, zb-h1 %g (a third), zb-v %g chunk units = %g stage "
            "units (a sixth)", one - 3 * m, h1 - 3 * m, zv - 6 * m, (zv - 6 * m) / 2);
}

void check_refused(Results& res) {
  const struct {
    const char* kind;
    int p, m, v, n_layer;
    const char* want;
  } cases[] = {
      {"1f1b", 4, 8, 1, 12, ""},
      {"interleaved", 4, 8, 2, 16, ""},
      {"interleaved", 2, 4, 2, 8, ""},
      {"zb-h1", 4, 2, 1, 8, ""},
      {"zb-v", 2, 1, 2, 4, ""},
      {"zigzag", 2, 4, 1, 0, "pipeline: schedule \"zigzag\" is unknown (one of \"gpipe\", "
                             "\"1f1b\", \"interleaved\", \"zb-h1\", \"zb-v\", \"file:PATH\")"},
      {"1f1b", 2, 4, 2, 0, "pipeline: v = 2 chunks per rank needs the \"interleaved\" or \"zb-v\" "
                           "schedule (\"1f1b\" runs one chunk per rank)"},
      {"zb-h1", 2, 4, 2, 0, "pipeline: v = 2 chunks per rank needs the \"interleaved\" or "
                            "\"zb-v\" schedule (\"zb-h1\" runs one chunk per rank)"},
      {"zb-v", 2, 4, 3, 0, "pipeline: the \"zb-v\" schedule runs v = 2 chunks per rank in a V "
                           "(rank r holds stages r and 2pp-1-r), not 3: set pp_virtual = 2"},
      {"interleaved", 3, 6, 1, 0, "pipeline: the \"interleaved\" schedule needs v >= 2 chunks "
                                  "per rank (with one chunk per rank it is \"1f1b\")"},
      {"interleaved", 4, 6, 2, 0, "pipeline: the \"interleaved\" schedule needs the micro-batches "
                                  "m = 6 to be a multiple of pp = 4 (they go through each chunk "
                                  "in groups of pp)"},
      {"1f1b", 4, 8, 1, 6, "pipeline: n_layer = 6 is not a multiple of pp*v = 4*1 = 4 (each of "
                           "the pp*v stages holds the same number of blocks unless [parallel] "
                           "pp_layers or pp_balance says otherwise)"},
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

// One rank's list of a two-rank pipeline from text: "F3", "B3", "W3" are the forward, backward
// and weight pass of micro-batch 3 (chunk 0; "F3.1": chunk 1), "sf3", "rf3", "sb3", "rb3" its
// send-fwd, recv-fwd, send-bwd and recv-bwd, with the other rank.
std::vector<PipeAction> two_rank_list(int rank, const std::string& text) {
  const std::map<std::string, PipeOp> ops = {
      {"F", PipeOp::Forward},       {"B", PipeOp::Backward},      {"W", PipeOp::Weight},
      {"sf", PipeOp::SendForward}, {"rf", PipeOp::RecvForward}, {"sb", PipeOp::SendBackward},
      {"rb", PipeOp::RecvBackward}};
  std::vector<PipeAction> out;
  std::istringstream words(text);
  for (std::string w; words >> w;) {
    const size_t digit = w.find_first_of("0123456789"), dot = w.find('.');
    const PipeOp op = ops.at(w.substr(0, digit));
    const int chunk = dot == std::string::npos ? 0 : std::stoi(w.substr(dot + 1));
    out.push_back({op, std::stoi(w.substr(digit)), chunk, pipe_op_is_comm(op) ? 1 - rank : -1});
  }
  return out;
}

PipelineSchedule by_hand(int m, int v, bool split, const std::string& rank0,
                         const std::string& rank1) {
  PipelineSchedule s;
  s.kind = "by hand", s.p = 2, s.m = m, s.v = v, s.split = split;
  s.ranks = {two_rank_list(0, rank0), two_rank_list(1, rank1)};
  return s;
}

// The checks above must see broken lists, in both modes: a send moved after the receive waiting
// for it (a deadlock buffered; under rendezvous the two share a run, are posted together, and the
// list runs), two receives swapped (mismatch), a backward before its forward, a weight pass
// before its backward; and a list that runs buffered but not under rendezvous: rank 0 sends
// micro-batch 2's activation in a run of its own and receives micro-batch 0's gradient only after
// F3, rank 1 sends that gradient in a run of its own and receives micro-batch 2's activation only
// after B1. Each send waits for a receive that the other rank posts after its own send completed.
void check_checkers(Results& res) {
  const PipeComm modes[] = {PipeComm::Buffered, PipeComm::Rendezvous};
  PipelineSchedule dead = pipeline_build("1f1b", 2, 1, 1);  // rank 0: F0 send-fwd0 recv-bwd0 B0
  std::swap(dead.ranks[0][1], dead.ranks[0][2]);
  std::string err = pipeline_simulate(dead, kNominal).error;
  res.check(err == "deadlock: a cycle of ranks waiting for each other: rank 0 action 1 (recv-bwd "
                   "micro 0 chunk 0 stage 0 peer 1) waits for rank 1; rank 1 action 0 (recv-fwd "
                   "micro 0 chunk 0 stage 1 peer 0) waits for rank 0",
            "a send after the receive that waits for it: %s", err.c_str());
  err = pipeline_simulate(dead, kNominal, PipeComm::Rendezvous).error;
  res.check(err.empty(), "the same, in one run under rendezvous: runs to the end%s%s",
            err.empty() ? "" : ": ", err.c_str());
  PipelineSchedule swapped = pipeline_build("1f1b", 2, 2, 1);  // rank 1 gets micro-batch 1 first
  std::vector<PipeAction>& r1 = swapped.ranks[1];
  std::swap(r1[0], r1[4]);
  PipelineSchedule backward_first = pipeline_build("1f1b", 1, 2, 1);  // F0 B0 F1 B1
  std::swap(backward_first.ranks[0][2], backward_first.ranks[0][3]);
  PipelineSchedule weight_first = pipeline_build("zb-h1", 1, 2, 1);  // F0 B0 W0 F1 B1 W1
  std::swap(weight_first.ranks[0][4], weight_first.ranks[0][5]);
  for (PipeComm mode : modes) {
    const char* how = mode == PipeComm::Buffered ? "buffered" : "rendezvous";
    err = pipeline_simulate(swapped, kNominal, mode).error;
    res.check(err == "rank 1 action 0 (recv-fwd micro 1 chunk 0 stage 1 peer 0): the next message "
                     "from rank 0 on its channel is activation micro 0 of stage 0",
              "receives out of order, %s: %s", how, err.c_str());
    err = pipeline_simulate(backward_first, kNominal, mode).error;
    res.check(err.find("backward before forward") != std::string::npos,
              "a backward before its forward, %s: %s", how, err.c_str());
    err = pipeline_simulate(weight_first, kNominal, mode).error;
    res.check(err == "rank 0 action 4 (W micro 1 chunk 0 stage 0 peer -1): weight pass before its "
                     "backward", "a weight pass before its backward, %s: %s", how, err.c_str());
  }
  const PipelineSchedule cross =
      by_hand(4, 1, false, "F0 sf0 F1 sf1 F2 sf2 F3 sf3 rb0 B0 rb1 B1 rb2 B2 rb3 B3",
              "rf0 F0 rf1 F1 B0 sb0 B1 sb1 rf2 F2 B2 sb2 rf3 F3 B3 sb3");
  const PipelineSimulation buffered = pipeline_simulate(cross, kNominal);
  res.check(buffered.error.empty() && buffered.makespan == 15,
            "both ranks sending first, buffered: runs to the end in %g (want (m+p-1)*(F+B+W) = "
            "15)%s%s",
            buffered.makespan, buffered.error.empty() ? "" : ": ", buffered.error.c_str());
  err = pipeline_simulate(cross, kNominal, PipeComm::Rendezvous).error;
  res.check(err == "deadlock: a cycle of ranks waiting for each other: rank 0 action 5 (send-fwd "
                   "micro 2 chunk 0 stage 0 peer 1) waits for rank 1; rank 1 action 5 (send-bwd "
                   "micro 0 chunk 0 stage 1 peer 0) waits for rank 0",
            "both ranks sending first, rendezvous: %s", err.c_str());
}

// Whether every pair of ranks posts its sends in the order the other posts the receives, all
// channels together: what one ordered channel per pair (MPI tag 0, one NCCL communicator) needs.
bool one_channel_suffices(const PipelineSchedule& s) {
  std::map<std::pair<int, int>, std::vector<std::tuple<bool, int, int>>> sent, received;
  for (int r = 0; r < s.p; ++r)
    for (const PipeAction& a : s.ranks[r]) {
      if (!pipe_op_is_comm(a.op)) continue;
      const bool fwd = pipe_op_is_forward_message(a.op);
      const int stage = s.stage(r, a.chunk);
      const int sender = pipe_op_is_send(a.op) ? stage : stage + (fwd ? -1 : 1);
      if (pipe_op_is_send(a.op)) sent[{r, a.peer}].push_back({fwd, a.micro, sender});
      else received[{a.peer, r}].push_back({fwd, a.micro, sender});
    }
  return sent == received;
}

// Channels. Two ranks, v = 2 in the Loop order (stages 0..3 on ranks 0, 1, 0, 1), m = 2. Rank 1
// sends both activations of chunk 0 (stage 1 -> 2) before the gradient of chunk 1 (stage 3 -> 2)
// of micro-batch 0, and rank 0 takes that gradient before the second activation: fine on
// separate channels, impossible on one. The built interleaved lists at p = 2 are the same
// (before channels, the "interleaved" schedule was refused at p = 2).
void check_channels(Results& res) {
  const PipelineSchedule s = by_hand(
      2, 2, false,
      "F0 sf0 F1 sf1 rf0.1 F0.1 sf0.1 rb0.1 B0.1 sb0.1 rf1.1 F1.1 sf1.1 rb1.1 B1.1 sb1.1 "
      "rb0 B0 rb1 B1",
      "rf0 F0 sf0 rf1 F1 sf1 rf0.1 F0.1 B0.1 sb0.1 rf1.1 F1.1 B1.1 sb1.1 rb0 B0 sb0 rb1 B1 sb1");
  std::string err = pipeline_simulate(s, kNominal).error;
  res.check(err.empty() && !one_channel_suffices(s), "p=2 v=2: receives in another order than "
            "the sends across channels: runs (%s), and one channel per pair would not suffice",
            err.empty() ? "no error" : err.c_str());
  std::map<int, int> seen;
  for (int r = 0; r < 2; ++r)
    for (const PipeAction& a : s.ranks[r])
      if (pipe_op_is_send(a.op)) seen[r * 10 + pipeline_channel(s, r, a)]++;
  // Channel = (gradient ? v : 0) + the sender's chunk.
  res.check(seen.size() == 6 && seen[0] == 2 && seen[1] == 2 && seen[3] == 2 && seen[10] == 2 &&
                seen[12] == 2 && seen[13] == 2 && s.ranks[0][4].op == PipeOp::RecvForward &&
                pipeline_channel(s, 0, s.ranks[0][4]) == 0 &&
                pipeline_channel(s, 0, s.ranks[0][7]) == 3,
            "p=2 v=2 channels: rank 0 sends chunk 0's and chunk 1's activations on 0 and 1, chunk "
            "1's gradients on 3; rank 1 chunk 0's activations on 0, its gradients on 2 and chunk "
            "1's on 3; a receive names its sender's channel");
  for (const auto& [kind, m, v] : {std::tuple("interleaved", 4, 2), std::tuple("interleaved", 6, 3),
                                   std::tuple("zb-v", 5, 2)}) {
    const PipelineSchedule built = pipeline_build(kind, 2, m, v);
    res.check(!one_channel_suffices(built) || std::string(kind) == "zb-v",
              "%s p=2 m=%d v=%d: one channel per pair would not suffice (it runs, above)", kind, m,
              v);
  }
}

// pipeline_comm_runs: the runs of consecutive sends and receives, as [begin, end).
void check_comm_runs(Results& res) {
  const std::vector<PipeAction> list = two_rank_list(1, "rf0 F0 B0 sb0 rf1 F1 B1 sb1");
  const std::vector<std::pair<size_t, size_t>> want = {{0, 1}, {3, 5}, {7, 8}};
  res.check(pipeline_comm_runs(list) == want, "comm runs of rf0 F0 B0 sb0 rf1 F1 B1 sb1: "
            "[0,1) [3,5) [7,8)");
  res.check(pipeline_comm_runs(two_rank_list(0, "F0 B0 W0")).empty(), "no comm runs in F0 B0 W0");
}

// The stage orders: Loop puts chunk c of rank r at stage c*p + r, V at r and 2p-1-r; owner and
// chunk invert them.
void check_orders(Results& res) {
  bool ok = true;
  for (int p : {1, 2, 3, 5})
    for (StageOrder o : {StageOrder::Loop, StageOrder::V})
      for (int r = 0; r < p; ++r)
        for (int c = 0; c < (o == StageOrder::V ? 2 : 3); ++c) {
          const int s = pipeline_stage(o, p, r, c);
          const int want = o == StageOrder::V && c == 1 ? 2 * p - 1 - r : c * p + r;
          ok = ok && s == want && pipeline_stage_owner(o, p, s) == r &&
               pipeline_stage_chunk(o, p, s) == c;
        }
  res.check(ok, "stage orders: Loop c*p + r, V r and 2p-1-r, owner and chunk invert them");
}

// A simulation with every action's measured duration: the nominal costs written out as
// measurements give the nominal makespan back; doubling one rank's durations slows the step.
void check_measured(Results& res) {
  const PipelineSchedule s = pipeline_build("zb-h1", 3, 5, 1);
  PipeCosts measured;
  for (int r = 0; r < s.p; ++r) {
    measured.measured.emplace_back();
    for (const PipeAction& a : s.ranks[r])
      if (!pipe_op_is_comm(a.op)) measured.measured[r].push_back(1.0);
  }
  const double nominal = pipeline_simulate(s, kNominal).makespan;
  const double got = pipeline_simulate(s, measured, PipeComm::Rendezvous).makespan;
  for (double& d : measured.measured[1]) d *= 2;
  const double slow = pipeline_simulate(s, measured, PipeComm::Rendezvous).makespan;
  res.check(got == nominal && slow >= 2 * 15, "measured durations: %g = nominal %g; rank 1 at "
            "twice the cost: %g (>= its own 30 units of work)", got, nominal, slow);
}

}  // namespace

int main() {
  Results res;
  res.verbose = false;  // the failures and the summary; the timelines below show the schedules
  for (int p : {1, 2, 3, 4})
    for (int m : {1, 2, 3, 4, 6, 8, 12}) {
      for (const char* kind : {"gpipe", "1f1b", "zb-h1"}) check_schedule(res, kind, p, m, 1);
      check_schedule(res, "zb-v", p, m, 2);
      for (int v : {2, 3})
        if (pipeline_rules("interleaved", p, m, v, 0).empty())
          check_schedule(res, "interleaved", p, m, v);
    }
  check_cost_formulas(res);
  check_refused(res);
  check_checkers(res);
  check_channels(res);
  check_comm_runs(res);
  check_orders(res);
  check_measured(res);
  for (const char* kind : {"gpipe", "1f1b", "zb-h1", "interleaved", "zb-v"}) {
    const std::string k = kind;
    const int v = k == "interleaved" || k == "zb-v" ? 2 : 1, m = k == "interleaved" ? 4 : 8;
    const PipelineSchedule s = pipeline_build(kind, 4, m, v);
    const PipelineSimulation sim = pipeline_simulate(s, kNominal);
    const double rdv = pipeline_simulate(s, kNominal, PipeComm::Rendezvous).makespan;
    std::printf("\n%s, p=4 m=%d v=%d, F = B = W = 1 per chunk, makespan %g (rendezvous %g), "
                "bubble %.3f:\n%s", kind, m, v, sim.makespan, rdv, sim.bubble(),
                pipeline_timeline(s, sim).c_str());
  }
  std::printf("\ntest_pipeline_schedule: %d of %d checks failed\n", res.failures, res.checks);
  return res.exit_status();
}
