// parallel/pipeline_messages.cu - where the boundary messages of a pipeline schedule go in its
// action lists, so that the lists run under rendezvous (a send completes only once the peer has
// posted the matching receive: NCCL always, MPI above its eager limit) without deadlock, and at
// the nominal costs without a wait.
//
// The rule. Under rendezvous a message moves when both its ends are between computes at the same
// moment; whoever gets there first waits. pipeline_build puts each receive right before the
// compute that needs it and each send right after the compute that made it. In gpipe and 1f1b
// both ends meet there everywhere. On the interleaved schedule's link from rank p-1 back to rank
// 0 they do not: there an activation waits p*B and a gradient p*F between its send and its
// receive, and with m > p those lists deadlock (docs/PARALLELISM.md, "Where the messages go").
//
// The placement. Simulate the lists with the nominal costs F = 1, B = 2 (every start a whole
// number) and cut each rank's timeline into gaps, gap j being where the rank waits before its
// compute j. Then move every message, pair of ranks by pair of ranks and in order (place_pair),
// to a gap of its sender and a gap of its receiver that overlap, the send as early and the
// receive as late as that allows:
//
//   rank a  ..|== compute ==|   gap x   |== compute ==|..      send in gap x,
//   rank b  ....|== compute ==|   gap y   |== compute ==|..    receive in gap y
//
// No message moves before the one ahead of it on the same pair, so both ends still post them in
// the same order, and no compute moves: the compute order and every start time of that
// simulation stay as they were, and rendezvous gives the same times. The price: some receives
// move several computes ahead of their consumer, so the receiving rank holds the tensor longer
// (the executor counts these in its activation slots), and some sends one compute later. Such
// gaps exist for every configuration tried (p <= 16, m <= 64, v <= 6); place_pair stops the job if
// one is missing.
#include "parallel/pipeline_schedule.h"

#include <algorithm>
#include <map>

#include "kernels/common.h"

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

// Simulates at the nominal costs, finds each action's gap, places every pair's messages and
// rebuilds the lists (see the top of the file).
void pipeline_place_messages(PipelineSchedule& s) {
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
