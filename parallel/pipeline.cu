// parallel/pipeline.cu - pipeline parallelism: the model cut into stages, one group of
// consecutive blocks per rank, micro-batches flowing through them.
//
// The idea. With pp ranks, rank r holds a stage of consecutive blocks (L/pp of them, or what
// [parallel] pp_layers or pp_balance = "auto" says: parallel/pipeline_balance.cu; interleaved
// and zb-v: v smaller chunks, see parallel/pipeline_schedule.cu), the first stage also the
// embedding and the last the head and the loss. A step's batch is cut into m = grad_accum
// micro-batches; micro-batch i goes forward through stage 0, 1, ..., each stage sending its
// output activation to the next, and its gradient comes back the same way. Each rank holds 1/pp of the weights, gradients and
// optimizer state, and of the activations of one micro-batch: what pipelining buys is memory,
// with only point-to-point traffic between neighbours.
//
// Who talks to whom, bytes. Rank r sends to r+1 and receives from r+1 (and rank pp-1 to rank 0
// between the chunks of an interleaved schedule; in zb-v's V order the chunks come back up, and
// rank pp-1's two chunks meet on the rank, by a copy), on the pp communicator, which pairs ranks
// with the same dp, cp and tp coordinates: each tp rank sends its own part of the boundary (under
// sequence parallelism B*T/tp tokens). Per micro-batch and boundary one activation forward and
// one gradient backward, each B*T*C elements (/tp with SP) in the compute dtype: per step and
// rank at most 2*m*v messages of that size. Compare dp: an all-reduce of every gradient.
//
// The schedule (1f1b by default; gpipe; interleaved; the zero-bubble zb-h1 and zb-v, whose
// backwards are split into B and W; a user's file) is a list of actions per rank, built in
// parallel/pipeline_schedule.cu (the warm-up, the steady state, the cool-down, the memory bound
// and the bubble of each) and checked by parallel/pipeline_simulator.cu; docs/PARALLELISM.md
// derives the bubbles. This file runs the list:
//
//   rank 1 of 4, 1f1b, m = 4:   recv-fwd 0, F0, send-fwd 0 | recv-fwd 1, F1, send-fwd 1 |
//                               recv-bwd 0 ... B0 ...
//
//   compute  |  F0  |  F1  |     |  B0    |  F2  |  B1    |  F3  |  B2    |  B3    |
//   p2p     r0>  >r2 r0>  >r2  <r2      >r0  r0> ...
//
// Activation slots. A forward keeps its activations in a slot until the backward of the same
// micro-batch and chunk frees it (its weight pass W, when the schedule splits backwards: W reads
// the activations and the output gradients B kept, model/gpt_backward.cu); the executor takes a
// free slot at the first action of a (micro-batch, chunk) in the list (the receive of its input,
// or its forward) and gives it back after the last (the send of its input gradient, its
// backward or its weight pass). A rank needs as many slots as that rule holds at its peak
// (pipeline_slots): the schedule's peak of chunk forwards in flight (1f1b: pp - rank at most,
// whatever m is), plus what the message placement receives early or sends late.
//
// Gradient buffers. A slot's residual-stream gradient is live for a shorter time than its
// activations: from the receive of its output gradient (or, on the last stage, the forward,
// whose head writes it; or, in the V order, the next chunk's backward on this rank, which copies
// it in) to the send of its input gradient (or its backward on stage 0, or its weight pass
// there when split: the embedding's backward reads it). So the gradients are a pool of their
// own, pipeline_grad_buffers of them, lent the same way; the buffer a send in a run of messages
// frees is lent again only after the run (a receive in the same run must not write it).
//
// Point to point. Each run of consecutive sends and receives in the list is posted as one
// p2p_batch (NCCL: one group; MPI: Isend + Irecv + Waitall), so two neighbours that send to
// each other at the same moment do not wait for each other. Sends and receives between two ranks
// match in posting order per channel (pipeline_channel: the activations a chunk sends, the
// gradients a chunk sends), each channel a tag of the pp communicator (comm_open_tags).
//
// Around the executor (model/gpt_pipeline.cu, parallel/param_store.cu): a tied model's root
// (GPT-2: wte, wpe, ln_f; a tied Llama: wte, ln_f) is held by the first and the last stage, its
// gradients summed over the pair once per step (the embedding group), so the two wte copies stay
// bitwise equal (the V order puts both ends on rank 0: one copy). An untied Llama splits it: the
// embedding unit {wte} on the first stage, the head unit {lm_head, ln_f} on the last, nothing
// held twice and nothing summed (model/gpt_layout.cu). Every unit's gradient is reduced over dp
// once per step, after the last backward (or weight pass) of its chunk; FSDP prefetches the first
// weights of the next forward or backward in the list (a weight pass needs none), not of the
// neighbouring unit.
//
// Measured bubble. Every compute action is timed with events (host clock on the CPU backend);
// pipeline_report gathers the timings of the pp group, compares the idle fraction with the
// bubble the simulator predicts from those durations (the schedule's own idle time, without
// communication or ranks sharing cores) and with the formula, and draws the step as an ASCII
// timeline.
#include "parallel/pipeline.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

#include "kernels/common.h"

static bool is_compute(PipeOp op) { return !pipe_op_is_comm(op); }

// The chunk of this rank whose slot (same micro-batch) compute action a uses besides its own:
// the previous stage's, when it is on this rank too (rank p-1 of the V order, or p = 1). A
// forward copies its input from that slot's output; a backward copies its input gradient into
// that slot's gradient, where the previous stage's backward reads it. Either way that slot is
// held already (its backward comes later). -1: none.
static int local_neighbour(const PipelineSchedule& s, int rank, const PipeAction& a) {
  if (a.op != PipeOp::Forward && a.op != PipeOp::Backward) return -1;
  const int stage = s.stage(rank, a.chunk) - 1;
  if (stage < 0 || s.owner(stage) != rank) return -1;
  return s.chunk_of(stage);
}

// When a (micro-batch, chunk) takes an activation slot and when it gives it back: the one rule
// the executor follows and the sizing counts with. Taken at the first action of it in the list
// (the receive of its input, or its forward on stage 0), given back after its last use (the
// send of its input gradient, its backward, its weight pass when the schedule splits; in a
// forward-only pass: never, each chunk has its own).
struct SlotRule {
  std::vector<char> take, give;  // per action of the list
};
static SlotRule slot_rule(const PipelineSchedule& s, int rank,
                          const std::vector<PipeAction>& list) {
  SlotRule rule{std::vector<char>(list.size(), 0), std::vector<char>(list.size(), 0)};
  std::map<int, int> first, last;  // chunk * m + micro -> action index
  for (size_t i = 0; i < list.size(); i++) {
    const PipeAction& a = list[i];
    const int key = a.chunk * s.m + a.micro;
    if (!first.count(key)) first[key] = (int)i;
    last[key] = (int)i;
  }
  for (const auto& [key, i] : first) rule.take[i] = 1;
  for (const auto& [key, i] : last) rule.give[i] = 1;
  return rule;
}

// The most activation sets a list holds at once. A schedule that receives an activation early
// holds it from then on: more than its peak of forwards in flight.
static int peak_slots(const PipelineSchedule& s, int rank) {
  const std::vector<PipeAction>& list = s.ranks[rank];
  const SlotRule rule = slot_rule(s, rank, list);
  int live = 0, peak = 1;
  for (size_t i = 0; i < list.size(); i++) {
    live += rule.take[i];
    peak = std::max(peak, live);
    live -= rule.give[i];
  }
  return peak;
}

// Which (micro-batch, chunk) gradients action i of a list uses (see the top of the file): its
// own, and a Backward the previous chunk's when that stage is on this rank too (-1: none).
static std::pair<int, int> grad_users(const PipelineSchedule& s, int rank, const PipeAction& a) {
  const int stage = s.stage(rank, a.chunk), own = a.chunk * s.m + a.micro;
  const int other = local_neighbour(s, rank, a);
  switch (a.op) {
    case PipeOp::RecvBackward:
    case PipeOp::SendBackward: return {own, -1};
    case PipeOp::Forward: return {stage == s.p * s.v - 1 ? own : -1, -1};
    case PipeOp::Backward: return {own, other >= 0 ? other * s.m + a.micro : -1};
    case PipeOp::Weight: return {stage == 0 ? own : -1, -1};
    default: return {-1, -1};
  }
}

// Per action of the list, the gradients first used there (taken) and last used there (given).
struct GradRule {
  std::vector<std::vector<int>> take, give;  // keys chunk * m + micro
};
static GradRule grad_rule(const PipelineSchedule& s, int rank,
                          const std::vector<PipeAction>& list) {
  GradRule rule{std::vector<std::vector<int>>(list.size()),
                std::vector<std::vector<int>>(list.size())};
  std::map<int, int> first, last;
  for (size_t i = 0; i < list.size(); i++) {
    const auto [a, b] = grad_users(s, rank, list[i]);
    for (int key : {a, b}) {
      if (key < 0) continue;
      if (!first.count(key)) first[key] = (int)i;
      last[key] = (int)i;
    }
  }
  for (const auto& [key, i] : first) rule.take[i].push_back(key);
  for (const auto& [key, i] : last) rule.give[i].push_back(key);
  return rule;
}

// Calls f(begin, end) for each step of a list in order: a compute action alone, or a run of
// communication actions (pipeline_comm_runs: the one grouping rule, shared with the simulator).
template <typename F>
static void for_each_step(const std::vector<PipeAction>& list, F f) {
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

// The most gradients a list holds at once: a run of messages takes all it takes before it gives.
static int peak_grads(const PipelineSchedule& s, int rank) {
  const std::vector<PipeAction>& list = s.ranks[rank];
  const GradRule rule = grad_rule(s, rank, list);
  int live = 0, peak = 1;
  for_each_step(list, [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; i++) live += (int)rule.take[i].size();
    peak = std::max(peak, live);
    for (size_t i = begin; i < end; i++) live -= (int)rule.give[i].size();
  });
  return peak;
}

void pipeline_init(Pipeline& pl, const std::string& kind, int m, int v, Comm* group) {
  const PipelineSchedule schedule = pipeline_build(kind, group->size, m, v);
  const PipelineSimulation sim = pipeline_simulate(schedule, PipeCosts{}, PipeComm::Rendezvous);
  CHECK(sim.error.empty(), "pipeline %s p=%d m=%d v=%d: %s", kind.c_str(), group->size, m, v,
        sim.error.c_str());
  pipeline_init_with(pl, schedule, group);
}

void pipeline_init_with(Pipeline& pl, const PipelineSchedule& schedule, Comm* group) {
  pl.schedule = schedule;
  pl.comm = group;
  pl.slots = pipeline_slots(pl.schedule, group->rank);
  pl.grads = pipeline_grad_buffers(pl.schedule, group->rank);
  comm_open_tags(*group, 2 * schedule.v);  // the message channels (pipeline_channel)
  if (pl.count_only) return;
  size_t computes = 0;
  for (const PipeAction& a : schedule.ranks[group->rank]) computes += is_compute(a.op);
  pl.events.resize(1 + 2 * computes);  // the start; each compute action: 2
  for (ops::Event& e : pl.events) e = ops::event_create();
}

int pipeline_slots(const PipelineSchedule& s, int rank) { return peak_slots(s, rank); }
int pipeline_grad_buffers(const PipelineSchedule& s, int rank) { return peak_grads(s, rank); }

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
  const std::vector<PipeAction>& list;
  const PipelineStages& stages;
  Comm& comm;
  int rank;
  ops::Stream s;
  SlotRule rule;
  SlotPool pool;
  GradRule grad_rule;  // empty: no gradients lent (a forward-only pass)
  SlotPool grads;      // keyed the same way: which gradient buffer a (micro, chunk) holds
  std::vector<char> last_of_chunk;  // per action: no later action of its op on its chunk
};

// The next Forward or Backward after action i (what to prefetch the weights of), or null.
const PipeAction* next_weighted(const std::vector<PipeAction>& list, size_t i) {
  for (size_t j = i + 1; j < list.size(); j++)
    if (list[j].op == PipeOp::Forward || list[j].op == PipeOp::Backward) return &list[j];
  return nullptr;
}

std::vector<char> last_of_chunk(const std::vector<PipeAction>& list) {
  std::vector<char> last(list.size(), 0);
  std::map<std::pair<int, int>, size_t> at;  // (op, chunk) -> its last action
  for (size_t i = 0; i < list.size(); i++) at[{(int)list[i].op, list[i].chunk}] = i;
  for (const auto& [key, i] : at) last[i] = 1;
  return last;
}

Executor make_executor(const PipelineSchedule& sched, const std::vector<PipeAction>& list,
                       const PipelineStages& stages, Comm& comm, int slots, ops::Stream s) {
  Executor ex{sched, list, stages, comm, comm.rank, s, slot_rule(sched, comm.rank, list), {},
              {}, {}, {}};
  ex.pool.m = sched.m;
  for (int i = slots - 1; i >= 0; i--) ex.pool.free.push_back(i);
  ex.grads.m = sched.m;
  ex.last_of_chunk = last_of_chunk(list);
  return ex;
}

// The gradient buffers of a training step: `grads` of them, lent by the rule.
void lend_grads(Executor& ex, int grads) {
  ex.grad_rule = grad_rule(ex.sched, ex.rank, ex.list);
  for (int i = grads - 1; i >= 0; i--) ex.grads.free.push_back(i);
}
// The buffer of gradient `key` (chunk * m + micro), taken from the pool at its first use.
int grad_buffer(Executor& ex, size_t i, int key) {
  const PipeAction k{PipeOp::Forward, key % ex.sched.m, key / ex.sched.m, -1};
  const std::vector<int>& take = ex.grad_rule.take[i];
  return std::find(take.begin(), take.end(), key) != take.end() ? ex.grads.take(k)
                                                                 : ex.grads.at(k);
}
void give_grads(Executor& ex, size_t i) {
  if (ex.grad_rule.give.empty()) return;
  for (int key : ex.grad_rule.give[i])
    ex.grads.give({PipeOp::Forward, key % ex.sched.m, key / ex.sched.m, -1});
}

// Posts the run of communication actions [begin, end) as one p2p_batch, each message on its
// channel's tag. A slot whose last use is a send in the run is free for a receive in it: the
// receive writes a slot's input, never the gradient being sent, and whatever writes that
// gradient next is ordered after this call.
void communicate(Executor& ex, size_t begin, size_t end) {
  std::vector<P2POp> ops;
  for (int sends = 1; sends >= 0; sends--)
    for (size_t j = begin; j < end; j++) {
      const PipeAction& a = ex.list[j];
      if (pipe_op_is_send(a.op) != (sends == 1)) continue;
      const int slot = ex.rule.take[j] ? ex.pool.take(a) : ex.pool.at(a);
      const bool grad = a.op == PipeOp::RecvBackward || a.op == PipeOp::SendBackward;
      const int at = grad ? grad_buffer(ex, j, a.chunk * ex.sched.m + a.micro) : slot;
      ops.push_back({sends == 1, ex.stages.boundary(a, at), ex.stages.boundary_count, a.peer,
                     pipeline_channel(ex.sched, ex.rank, a)});
      if (ex.rule.give[j]) ex.pool.give(a);
    }
  p2p_batch(ex.comm, ops.data(), (int)ops.size(), ex.stages.dt, ex.s);
  for (size_t j = begin; j < end; j++) give_grads(ex, j);  // after the run (top of the file)
}

// A compute action on its slot (slot_rule: taken here on stage 0, given back here when nothing
// is sent after it).
void compute(Executor& ex, size_t i) {
  const PipeAction& a = ex.list[i];
  ComputeCall call;
  call.action = a;
  call.slot = ex.rule.take[i] ? ex.pool.take(a) : ex.pool.at(a);
  call.next = next_weighted(ex.list, i);
  call.split = ex.sched.split;
  call.last_of_chunk = ex.last_of_chunk[i];
  const int other = local_neighbour(ex.sched, ex.rank, a);
  if (other >= 0) call.local_slot = ex.pool.at({a.op, a.micro, other, -1});
  if (!ex.grad_rule.take.empty()) {
    const auto [own, prev] = grad_users(ex.sched, ex.rank, a);
    if (own >= 0) call.grad = grad_buffer(ex, i, own);
    if (prev >= 0) call.local_grad = grad_buffer(ex, i, prev);
  }
  ex.stages.compute(call);
  if (ex.rule.give[i]) ex.pool.give(a);
  give_grads(ex, i);
}

}  // namespace

void pipeline_run(Pipeline& pl, const PipelineStages& stages, ops::Stream s) {
  const std::vector<PipeAction>& list = pl.schedule.ranks[pl.comm->rank];
  Executor ex = make_executor(pl.schedule, list, stages, *pl.comm, pl.slots, s);
  lend_grads(ex, pl.grads);
  const bool timed_run = !pl.count_only;
  if (timed_run) ops::event_record(pl.events[0], s);
  std::vector<PipeAction> timed;
  size_t e = 1;
  for_each_step(list, [&](size_t begin, size_t end) {
    if (end > begin + 1 || !is_compute(list[begin].op)) return communicate(ex, begin, end);
    if (timed_run) ops::event_record(pl.events[e++], s);
    compute(ex, begin);
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
  const PipelineSchedule& sc = pl.schedule;
  const int r = pl.comm->rank, S = sc.p * sc.v;
  std::vector<PipeAction> list;  // each chunk: receive the input, forward, send the output
  for (int c = 0; c < sc.v; c++) {
    const int stage = sc.stage(r, c);
    if (stage > 0 && sc.owner(stage - 1) != r)
      list.push_back({PipeOp::RecvForward, 0, c, sc.owner(stage - 1)});
    list.push_back({PipeOp::Forward, 0, c, -1});
    if (stage < S - 1 && sc.owner(stage + 1) != r)
      list.push_back({PipeOp::SendForward, 0, c, sc.owner(stage + 1)});
  }
  CHECK(pl.slots >= sc.v, "pipeline: %d activation slots for %d chunks", pl.slots, sc.v);
  Executor ex = make_executor(sc, list, stages, *pl.comm, sc.v, s);
  std::fill(ex.rule.give.begin(), ex.rule.give.end(), 0);  // a slot per chunk, kept to the end
  for_each_step(list, [&](size_t begin, size_t end) {
    if (end > begin + 1 || !is_compute(list[begin].op)) communicate(ex, begin, end);
    else compute(ex, begin);
  });
}

// ---------------------------------------------------------------------------------------------
// Report
// ---------------------------------------------------------------------------------------------
// One rank's compute actions (in time order) as characters: each at least one column and never
// on top of the previous one, so every action keeps its letter while there are fewer actions
// than columns (an action shorter than a column is pushed right by at most the ones before it,
// and left by at most the ones after it, which each keep a column at the end).
static std::string draw_rank(const std::vector<double>& t, int n, double span, int width) {
  std::string line(width, '.');
  int next_free = 0;
  for (int k = 0; k < n; k++) {
    const double* a = &t[5 * k];  // op, micro, chunk, start, end
    const int last = width - (n - k);  // the columns after it are left to the rest
    const int c0 = std::min(last, std::max(next_free, (int)(a[3] / span * width)));
    const int c1 = std::max(c0 + 1, std::min(last + 1, (int)std::lround(a[4] / span * width)));
    next_free = c1;
    for (int c = c0; c < c1; c++) line[c] = '=';
    line[c0] = (a[2] > 0 ? "fbw" : "FBW")[(int)a[0]];  // PipeOp Forward, Backward, Weight
    if (c1 - c0 >= 2) line[c0 + 1] = "0123456789abcdef"[(int)a[1] % 16];
  }
  return line;
}

// The same actions as numbers, for whoever checks the drawing or the bubbles: each as its op
// letter (F, B, W), micro-batch, '.', chunk, '@', start and end in ms from the rank's own start.
static std::string list_rank(const std::vector<double>& t, int n) {
  std::string out;
  char buf[96];
  for (int k = 0; k < n; k++) {
    const double* a = &t[5 * k];
    std::snprintf(buf, sizeof(buf), " %c%d.%d@%.6f-%.6f", "FBW"[(int)a[0]], (int)a[1], (int)a[2],
                  a[3], a[4]);
    out += buf;
  }
  return out;
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
  PipeCosts measured;  // every rank's actions at their measured durations, run by the simulator
  for (int r = 0; r < p; r++) {
    measured.measured.emplace_back();
    for (int k = 0; k < n; k++)
      measured.measured[r].push_back(all[5 * ((size_t)r * n + k) + 4] -
                                     all[5 * ((size_t)r * n + k) + 3]);
  }
  rep.bubble_predicted = pipeline_simulate(sch, measured, PipeComm::Rendezvous).bubble();
  rep.bubble_formula = pipeline_schedule_bubble(sch.kind, p, sch.m, sch.v);
  if (timeline && rep.span_ms > 0)
    for (int r = 0; r < p; r++) {
      const std::vector<double> t(all.begin() + 5 * (size_t)r * n,
                                  all.begin() + 5 * (size_t)(r + 1) * n);
      rep.timeline += "pp rank " + std::to_string(r) + " |" + draw_rank(t, n, rep.span_ms, width) +
                      "|\n";
      rep.actions += "pp rank " + std::to_string(r) + " actions:" + list_rank(t, n) + "\n";
    }
  return rep;
}
