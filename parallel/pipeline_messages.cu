// parallel/pipeline_messages.cu - where the boundary messages of a pipeline schedule go in its
// action lists, so that the lists run under rendezvous (a send completes only once the peer has
// posted the matching receive: NCCL always, MPI above its eager limit) without deadlock, and at
// the nominal costs (F = B = W = 1 per chunk) without a wait.
//
// The rule. Under rendezvous a message moves when both its ends are between computes at the same
// moment; whoever gets there first waits. pipeline_build puts each receive right before the
// compute that needs it and each send right after the compute that made it. In gpipe and 1f1b
// both ends meet there everywhere. On the interleaved schedule's link from rank p-1 back to rank
// 0 they do not: there an activation waits p*B and a gradient p*F between its send and its
// receive, and with m > p those lists deadlock (docs/PARALLELISM.md, "Where the messages go").
//
// The placement. Simulate the lists with the nominal costs (every start a whole number) and cut
// each rank's timeline into gaps, gap j being where the rank waits before its compute j. Then
// move every message, channel by channel of each pair of ranks (pipeline_channel) and in order
// (place_pair),
// to a gap of its sender and a gap of its receiver that overlap, the send as early and the
// receive as late as that allows:
//
//   rank a  ..|== compute ==|   gap x   |== compute ==|..      send in gap x,
//   rank b  ....|== compute ==|   gap y   |== compute ==|..    receive in gap y
//
// No message moves before the one ahead of it on the same channel, so both ends still post them
// in the same order, and no compute moves: the compute order and every start time of that
// simulation stay as they were, and rendezvous gives the same times. The price: some receives
// move several computes ahead of their consumer, so the receiving rank holds the tensor longer
// (the executor counts these in its activation slots), and some sends one compute later. Such
// gaps exist for every built schedule tried (p <= 16, m <= 64, v <= 6); for a message without
// one (a user's schedule may have such) the placement says which.
#include "parallel/pipeline_schedule.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <tuple>

#include "kernels/common.h"

namespace {

// Gap j of a rank: the place in its list before its compute j (after compute j-1), where its run
// of sends and receives goes. In the nominal timeline the rank sits there from `begin` (compute
// j-1 ends) to `end` (compute j starts); the last gap, after the last compute, is a point.
struct Gap {
  double begin, end;
};

std::vector<Gap> gaps_of(const PipelineSimulation& sim, int r) {
  std::vector<Gap> gaps;
  double t = 0;
  for (size_t k = 0; k < sim.starts[r].size(); ++k) {
    gaps.push_back({t, sim.starts[r][k].first});
    t = sim.ends[r][k];
  }
  gaps.push_back({t, t});
  return gaps;
}

// The messages of one channel from rank a to rank b, in order: the k-th send (action sends[k])
// goes with the k-th receive of b (action recvs[k]). at[r][i]: the gap of action i of rank r,
// updated here. The send goes to the first gap of a, from the one it is in now on, that overlaps
// some gap of b at or before the receive's present one; the receive to the latest such gap of b.
// A message never goes before the previous one, so both ends still post them in the same order.
// Returns "" or the message that finds no place.
std::string place_channel(const PipelineSchedule& s, int a, int b, const std::vector<size_t>& sends,
                          const std::vector<size_t>& recvs,
                          const std::vector<std::vector<Gap>>& gaps,
                          std::vector<std::vector<int>>& at) {
  char buf[300];
  if (sends.size() != recvs.size()) {
    std::snprintf(buf, sizeof(buf), "rank %d sends %zu messages of one kind to rank %d, which "
                  "receives %zu", a, sends.size(), b, recvs.size());
    return buf;
  }
  int first_x = 0, first_y = 0;  // the gaps of the previous message
  for (size_t k = 0; k < sends.size(); ++k) {
    const int from_x = std::max(at[a][sends[k]], first_x), from_y = at[b][recvs[k]];
    bool found = false;
    for (int y = from_y; !found && y >= first_y; --y)
      for (int x = from_x; !found && x < (int)gaps[a].size(); ++x) {
        if (gaps[a][x].begin > gaps[b][y].end) break;  // later gaps of a overlap nothing
        if (gaps[a][x].end >= gaps[b][y].begin) {
          at[a][sends[k]] = first_x = x;
          at[b][recvs[k]] = first_y = y;
          found = true;
        }
      }
    if (found) continue;
    const PipeAction& msg = s.ranks[a][sends[k]];
    const std::string line = msg.line > 0 ? "line " + std::to_string(msg.line) + ": " : "";
    std::snprintf(buf, sizeof(buf), "%srank %d and rank %d are never between computes at the same "
                  "time for the %s of micro-batch %d (chunk %d): no place for it under rendezvous",
                  line.c_str(), a, b, msg.op == PipeOp::SendForward ? "activation" : "gradient",
                  msg.micro, msg.chunk);
    return buf;
  }
  return "";
}

// List r again: in each gap its sends, then its receives (each kind in its old order), then the
// compute. Sends first, as pipeline_with_messages makes them: a send never waits for a receive of
// its own run.
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

// Simulates at the nominal costs, finds each action's gap, places every channel's messages and
// rebuilds the lists (see the top of the file).
std::string pipeline_try_place_messages(PipelineSchedule& s) {
  const PipelineSimulation sim = pipeline_simulate(s, PipeCosts{});
  if (!sim.error.empty()) return sim.error;
  std::vector<std::vector<Gap>> gaps;
  std::vector<std::vector<int>> at(s.p);  // per rank and action: its gap
  // (from rank, to rank, channel) -> its sends' and its receives' action indices
  std::map<std::tuple<int, int, int>, std::pair<std::vector<size_t>, std::vector<size_t>>> msgs;
  for (int r = 0; r < s.p; ++r) {
    gaps.push_back(gaps_of(sim, r));
    int gap = 0;
    for (size_t i = 0; i < s.ranks[r].size(); ++i) {
      const PipeAction& a = s.ranks[r][i];
      at[r].push_back(gap);
      if (!pipe_op_is_comm(a.op)) {
        ++gap;
        continue;
      }
      const int c = pipeline_channel(s, r, a);
      if (pipe_op_is_send(a.op)) msgs[{r, a.peer, c}].first.push_back(i);
      else msgs[{a.peer, r, c}].second.push_back(i);
    }
  }
  for (const auto& [key, ends] : msgs) {
    const std::string err = place_channel(s, std::get<0>(key), std::get<1>(key), ends.first,
                                          ends.second, gaps, at);
    if (!err.empty()) return err;
  }
  for (int r = 0; r < s.p; ++r) s.ranks[r] = rebuild(s.ranks[r], at[r], gaps[r].size());
  return "";
}

void pipeline_place_messages(PipelineSchedule& s) {
  const std::string err = pipeline_try_place_messages(s);
  CHECK(err.empty(), "pipeline %s p=%d m=%d v=%d: %s", s.kind.c_str(), s.p, s.m, s.v,
        err.c_str());
}
