// parallel/pipeline.cu - pipeline parallelism: the model cut into stages, one group of
// consecutive blocks per rank, micro-batches flowing through them.
//
// The idea. With pp ranks, rank r holds blocks [r*L/pp, (r+1)*L/pp) (interleaved: v smaller
// chunks, see parallel/pipeline_schedule.cu), the first stage also the embedding and the last
// the head and the loss. A step's batch is cut into m = grad_accum micro-batches; micro-batch i
// goes forward through stage 0, 1, ..., each stage sending its output activation to the next,
// and its gradient comes back the same way. Each rank holds 1/pp of the weights, gradients and
// optimizer state, and of the activations of one micro-batch: what pipelining buys is memory,
// with only point-to-point traffic between neighbours.
//
// Who talks to whom, bytes. Rank r sends to r+1 and receives from r+1 (and rank pp-1 to rank 0
// between the chunks of an interleaved schedule), on the pp communicator, which pairs ranks with
// the same dp, cp and tp coordinates: each tp rank sends its own part of the boundary (under
// sequence parallelism B*T/tp tokens). Per micro-batch and boundary one activation forward and
// one gradient backward, each B*T*C elements (/tp with SP) in the compute dtype: per step and
// rank at most 2*m*v messages of that size. Compare dp: an all-reduce of every gradient.
//
// The schedule (1f1b by default; gpipe; interleaved) is a list of actions per rank, built in
// parallel/pipeline_schedule.cu (the warm-up, the steady one-forward-one-backward state, the
// cool-down and the memory bound) and checked by parallel/pipeline_simulator.cu; the bubble
// (p-1)/(v*m + p-1) is derived in docs/PARALLELISM.md. This file runs the list:
//
//   rank 1 of 4, 1f1b, m = 4:   recv-fwd 0, F0, send-fwd 0 | recv-fwd 1, F1, send-fwd 1 |
//                               recv-bwd 0 ... B0 ...
//
//   compute  |  F0  |  F1  |     |  B0    |  F2  |  B1    |  F3  |  B2    |  B3    |
//   p2p     r0>  >r2 r0>  >r2  <r2      >r0  r0> ...
//
// Activation slots. A forward keeps its activations in a slot until the backward of the same
// micro-batch and chunk frees it; the executor takes a free slot at the forward (or at the
// receive of its input) and gives it back after the backward's gradient is sent. A rank needs as
// many slots as its peak number of chunk forwards in flight, which the schedule's simulation
// gives (1f1b: pp - rank at most, whatever m is).
//
// Point to point. Each run of consecutive sends and receives in the list is posted as one
// send_recv (NCCL: one group; MPI: Isend + Irecv + Waitall), so two neighbours that send to
// each other at the same moment do not wait for each other. Sends and receives between two ranks
// match in posting order.
//
// Around the executor (model/gpt_pipeline.cu, parallel/param_store.cu): the root (wte, wpe, ln_f)
// is held by the first and the last stage, its gradients summed over the pair once per step
// (the embedding group), so the two wte copies stay bitwise equal; every unit's gradient is
// reduced over dp once per step, after the last micro-batch's backward of its chunk; FSDP
// prefetches the first weights of the next action in the list, not of the neighbouring unit.
//
// Measured bubble. Every compute action is timed with events (host clock on the CPU backend);
// pipeline_report gathers the timings of the pp group and compares the idle fraction with the
// formula, and draws the step as an ASCII timeline.
#include "parallel/pipeline.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "kernels/common.h"

static bool is_compute(PipeOp op) { return !pipe_op_is_comm(op); }

// When a (micro-batch, chunk) takes an activation slot and when it gives it back: the one rule
// the executor follows and the sizing counts with. Taken at the receive of its input, or at its
// forward on stage 0; given back after the last use - the send of its input gradient, its
// backward on stage 0 (nothing to send), and in a forward-only pass the send of its output or
// its forward on the last stage.
struct SlotRule {
  bool take, give;
};
static SlotRule slot_rule(const PipeAction& a, bool training, int stage, int stages) {
  const bool fwd = a.op == PipeOp::Forward, bwd = a.op == PipeOp::Backward;
  const bool take = a.op == PipeOp::RecvForward || (fwd && stage == 0);
  const bool give = a.op == PipeOp::SendBackward || (bwd && stage == 0) ||
                    (!training && (a.op == PipeOp::SendForward || (fwd && stage == stages - 1)));
  return {take, give};
}

// The most activation sets this rank's list holds at once. A schedule that receives an
// activation early holds it from then on: more than its peak of forwards in flight.
static int peak_slots(const PipelineSchedule& s, int rank) {
  int live = 0, peak = 1;
  for (const PipeAction& a : s.ranks[rank]) {
    const SlotRule rule = slot_rule(a, true, a.chunk * s.p + rank, s.p * s.v);
    live += (int)rule.take - (int)rule.give;
    peak = std::max(peak, live);
  }
  return peak;
}

void pipeline_init(Pipeline& pl, const std::string& kind, int m, int v, Comm* group) {
  const PipelineSchedule schedule = pipeline_build(kind, group->size, m, v);
  const PipelineSimulation sim = pipeline_simulate(schedule, 1.0, 2.0, PipeComm::Rendezvous);
  CHECK(sim.error.empty(), "pipeline %s p=%d m=%d v=%d: %s", kind.c_str(), group->size, m, v,
        sim.error.c_str());
  pipeline_init_with(pl, schedule, group);
}

void pipeline_init_with(Pipeline& pl, const PipelineSchedule& schedule, Comm* group) {
  const int m = schedule.m, v = schedule.v;
  pl.schedule = schedule;
  pl.comm = group;
  pl.slots = pipeline_slots(pl.schedule, group->rank);
  if (pl.count_only) return;
  pl.events.resize(1 + 4 * (size_t)m * v);  // the start; each forward and backward: 2
  for (ops::Event& e : pl.events) e = ops::event_create();
}

int pipeline_slots(const PipelineSchedule& s, int rank) { return peak_slots(s, rank); }

void pipeline_destroy(Pipeline& pl) {
  for (ops::Event e : pl.events) ops::event_destroy(e);
  pl.events.clear();
}

namespace {

// Which slot holds the activations of (micro-batch, chunk) while it is in flight.
struct SlotPool {
  int m = 1;
  std::vector<int> free;
  std::map<int, int> held;  // chunk * m + micro -> slot

  int key(const PipeAction& a) const { return a.chunk * m + a.micro; }
  int take(const PipeAction& a) {
    if (free.empty()) BUG("pipeline: no free activation slot for micro-batch %d", a.micro);
    const int slot = free.back();
    free.pop_back();
    held[key(a)] = slot;
    return slot;
  }
  int at(const PipeAction& a) const {
    auto it = held.find(key(a));
    if (it == held.end()) BUG("pipeline: micro-batch %d chunk %d has no slot", a.micro, a.chunk);
    return it->second;
  }
  void give(const PipeAction& a) {
    free.push_back(at(a));
    held.erase(key(a));
  }
};

struct Executor {
  const PipelineSchedule& sched;
  const PipelineStages& stages;
  Comm& comm;
  int rank;
  bool training;  // false: forward only, a slot is free once its output is sent
  ops::Stream s;
  SlotPool pool;

  SlotRule rule(const PipeAction& a) const {
    return slot_rule(a, training, a.chunk * sched.p + rank, sched.p * sched.v);
  }
};

const PipeAction* next_compute(const std::vector<PipeAction>& list, size_t i) {
  for (size_t j = i + 1; j < list.size(); j++)
    if (is_compute(list[j].op)) return &list[j];
  return nullptr;
}

// Posts the run of communication actions [begin, end) as one p2p_batch. A slot whose last use is
// a send in the run is free for a receive in it: the receive writes a slot's input, never the
// gradient being sent, and whatever writes that gradient next is ordered after this call.
void communicate(Executor& ex, const std::vector<PipeAction>& list, size_t begin, size_t end) {
  std::vector<P2POp> ops;
  for (size_t j = begin; j < end; j++) {
    const PipeAction& a = list[j];
    if (!pipe_op_is_send(a.op)) continue;
    ops.push_back({true, ex.stages.boundary(a.op, ex.pool.at(a)), ex.stages.boundary_count,
                   a.peer});
    if (ex.rule(a).give) ex.pool.give(a);
  }
  for (size_t j = begin; j < end; j++) {
    const PipeAction& a = list[j];
    if (pipe_op_is_send(a.op)) continue;
    const int slot = ex.rule(a).take ? ex.pool.take(a) : ex.pool.at(a);
    ops.push_back({false, ex.stages.boundary(a.op, slot), ex.stages.boundary_count, a.peer});
  }
  p2p_batch(ex.comm, ops.data(), (int)ops.size(), ex.stages.dt, ex.s);
}

// A compute action on its slot (slot_rule: taken here on stage 0, given back here when nothing
// is sent after it).
void compute(Executor& ex, const std::vector<PipeAction>& list, size_t i) {
  const PipeAction& a = list[i];
  const SlotRule rule = ex.rule(a);
  const int slot = rule.take ? ex.pool.take(a) : ex.pool.at(a);
  ex.stages.compute(a, slot, next_compute(list, i));
  if (rule.give) ex.pool.give(a);
}

// Calls f(begin, end) for each step of a list in order: a compute action alone, or a run of
// communication actions (pipeline_comm_runs: the one grouping rule, shared with the simulator).
template <typename F>
void for_each_step(const std::vector<PipeAction>& list, F f) {
  const std::vector<std::pair<size_t, size_t>> runs = pipeline_comm_runs(list);
  size_t r = 0;
  for (size_t i = 0; i < list.size();) {
    if (r < runs.size() && runs[r].first == i) {
      f(runs[r].first, runs[r].second);
      i = runs[r++].second;
    } else {
      f(i, i + 1);
      i++;
    }
  }
}

SlotPool make_pool(int slots, int m) {
  SlotPool pool;
  pool.m = m;
  for (int i = slots - 1; i >= 0; i--) pool.free.push_back(i);
  return pool;
}

}  // namespace

void pipeline_run(Pipeline& pl, const PipelineStages& stages, ops::Stream s) {
  const int rank = pl.comm->rank;
  const std::vector<PipeAction>& list = pl.schedule.ranks[rank];
  Executor ex{pl.schedule, stages, *pl.comm, rank, true, s, make_pool(pl.slots, pl.schedule.m)};
  const bool timed_run = !pl.count_only;
  if (timed_run) ops::event_record(pl.events[0], s);
  std::vector<PipeAction> timed;
  size_t e = 1;
  for_each_step(list, [&](size_t begin, size_t end) {
    if (end > begin + 1 || !is_compute(list[begin].op)) return communicate(ex, list, begin, end);
    if (timed_run) ops::event_record(pl.events[e++], s);
    compute(ex, list, begin);
    if (timed_run) ops::event_record(pl.events[e++], s);
    timed.push_back(list[begin]);
  });
  if (!timed_run) return;
  ops::event_sync(pl.events[e - 1]);
  pl.timing.clear();
  for (size_t k = 0; k < timed.size(); k++)
    pl.timing.push_back({timed[k], ops::event_elapsed_ms(pl.events[0], pl.events[1 + 2 * k]),
                         ops::event_elapsed_ms(pl.events[0], pl.events[2 + 2 * k])});
}

void pipeline_forward(const Pipeline& pl, const PipelineStages& stages, ops::Stream s) {
  const int p = pl.schedule.p, v = pl.schedule.v, S = p * v;
  std::vector<PipeAction> list;  // each chunk: receive the input, forward, send the output
  for (int c = 0; c < v; c++) {
    const int stage = c * p + pl.comm->rank;
    if (stage > 0) list.push_back({PipeOp::RecvForward, 0, c, (stage - 1) % p});
    list.push_back({PipeOp::Forward, 0, c, -1});
    if (stage < S - 1) list.push_back({PipeOp::SendForward, 0, c, (stage + 1) % p});
  }
  Executor ex{pl.schedule, stages, *pl.comm, pl.comm->rank, false, s, make_pool(1, 1)};
  for_each_step(list, [&](size_t begin, size_t end) {
    if (end > begin + 1 || !is_compute(list[begin].op)) communicate(ex, list, begin, end);
    else compute(ex, list, begin);
  });
}

// ---------------------------------------------------------------------------------------------
// Report
// ---------------------------------------------------------------------------------------------
// One rank's compute actions (in time order) as characters: each at least one column and never
// on top of the previous one, so every action keeps its letter while there are fewer actions
// than columns (an action shorter than a column is pushed right by at most the ones before it).
static std::string draw_rank(const std::vector<double>& t, int n, double span, int width) {
  std::string line(width, '.');
  int next_free = 0;
  for (int k = 0; k < n; k++) {
    const double* a = &t[5 * k];  // op, micro, chunk, start, end
    const int c0 = std::min(width - 1, std::max(next_free, (int)(a[3] / span * width)));
    const int c1 = std::max(c0 + 1, std::min(width, (int)std::lround(a[4] / span * width)));
    next_free = c1;
    const bool fwd = a[0] == (double)PipeOp::Forward;
    for (int c = c0; c < c1; c++) line[c] = '=';
    line[c0] = a[2] > 0 ? (fwd ? 'f' : 'b') : (fwd ? 'F' : 'B');
    if (c1 - c0 >= 2) line[c0 + 1] = "0123456789abcdef"[(int)a[1] % 16];
  }
  return line;
}

PipelineReport pipeline_report(const Pipeline& pl, bool timeline, int width) {
  const PipelineSchedule& sch = pl.schedule;
  const int p = sch.p, n = (int)pl.timing.size();
  std::vector<double> mine(5 * n), all(5 * (size_t)n * p);
  for (int k = 0; k < n; k++) {
    const ActionTiming& t = pl.timing[k];
    const double row[5] = {(double)t.action.op, (double)t.action.micro, (double)t.action.chunk,
                           t.start_ms, t.end_ms};
    std::copy(row, row + 5, &mine[5 * k]);
  }
  all_gather_host(*pl.comm, mine.data(), mine.size() * sizeof(double), all.data());
  PipelineReport rep;
  rep.busy_ms.assign(p, 0.0);
  for (int r = 0; r < p; r++)
    for (int k = 0; k < n; k++) {
      const double* a = &all[5 * ((size_t)r * n + k)];
      rep.busy_ms[r] += a[4] - a[3];
      rep.span_ms = std::max(rep.span_ms, a[4]);
    }
  double mean_busy = 0;
  for (double b : rep.busy_ms) mean_busy += b / p;
  rep.bubble = rep.span_ms > 0 ? 1.0 - mean_busy / rep.span_ms : 0.0;
  rep.bubble_formula = pipeline_bubble(p, sch.m, sch.v);
  if (timeline && rep.span_ms > 0)
    for (int r = 0; r < p; r++) {
      const std::vector<double> t(all.begin() + 5 * (size_t)r * n,
                                  all.begin() + 5 * (size_t)(r + 1) * n);
      rep.timeline += "pp rank " + std::to_string(r) + " |" + draw_rank(t, n, rep.span_ms, width) +
                      "|\n";
    }
  return rep;
}
