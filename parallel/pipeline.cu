// parallel/pipeline.cu - pipeline parallelism: the model cut into stages, one group of
// consecutive blocks per rank, micro-batches flowing through them.
//
// The idea. With pp ranks, rank r holds a stage of consecutive blocks (L/pp of them, or what
// [parallel] pp_layers or pp_balance = "auto" says: parallel/pipeline_balance.cu; interleaved
// and zb-v: v smaller chunks, see parallel/pipeline_schedule.cu), the first stage also the
// embedding and the last the head and the loss. A step's batch is cut into m = grad_accum
// micro-batches; micro-batch i goes forward through stage 0, 1, ..., each stage sending its
// output activation to the next, and its gradient comes back the same way. Each rank holds 1/pp
// of the weights, gradients and optimizer state, and of the activations of one micro-batch: what
// pipelining buys is memory, with only point-to-point traffic between neighbours.
//
// Who talks to whom, bytes. Rank r receives its input activations from rank r-1 and sends its
// output to rank r+1; the gradients go back the other way, from r+1 to r and on to r-1 (between
// the chunks of an interleaved schedule rank pp-1 also sends to rank 0, and rank 0's gradients
// go back to rank pp-1; in zb-v's V order the chunks come back up, and rank pp-1's two chunks
// meet on the rank, by a copy). All of it on the pp communicator, which pairs ranks with the same
// dp, cp and tp coordinates: each tp rank sends its own part of the boundary (under sequence
// parallelism B*T/tp tokens). Per micro-batch and boundary one activation forward and one
// gradient backward, each B*T*C elements (/tp with SP) in the compute dtype: per step and rank at
// most 2*m*v messages of that size. Compare dp: an all-reduce of every gradient.
//
// The schedule (1f1b by default; gpipe; interleaved; the zero-bubble zb-h1 and zb-v, whose
// backwards are split into B and W; a user's file) is a list of actions per rank, built in
// parallel/pipeline_schedule.cu (the warm-up, the steady state, the cool-down, the memory bound
// and the bubble of each) and checked by parallel/pipeline_simulator.cu; docs/PARALLELISM.md
// derives the bubbles. This file runs the list. Rank 1's for 1f1b at p = 4, m = 4, as
// pipeline_build writes it ([...]: a run of messages, posted as one p2p_batch; "to r2": the
// peer), and the step at F = B = W = 1 as the simulator draws it, with its makespan, its bubble
// and the most chunk activations each rank holds (test/test_pipeline_headers.cpp draws both and
// checks that this comment shows what the builder makes):
//
//   rank 1: [recv-fwd 0 from r0] F0 [send-fwd 0 to r2, recv-fwd 1 from r0] F1
//           [send-fwd 1 to r2, recv-fwd 2 from r0] F2 [send-fwd 2 to r2, recv-bwd 0 from r2] B0
//           [send-bwd 0 to r0, recv-fwd 3 from r0] F3 [send-fwd 3 to r2, recv-bwd 1 from r2] B1
//           [send-bwd 1 to r0, recv-bwd 2 from r2] B2 [send-bwd 2 to r0, recv-bwd 3 from r2] B3
//           [send-bwd 3 to r0]
//
//   1f1b, p = 4, m = 4, 21 units, bubble 42.9%, peak 4, 3, 2, 1
//   rank 0 |F0F1F2F3............B0==..B1==..B2==..B3==|
//   rank 1 |..F0F1F2........B0==F3B1==..B2==..B3==....|
//   rank 2 |....F0F1....B0==F2B1==F3B2==..B3==........|
//   rank 3 |......F0B0==F1B1==F2B2==F3B3==............|
//
// Activation slots. A forward keeps its activations in a slot until the backward of the same
// micro-batch and chunk frees it (its weight pass W, when the schedule splits backwards: W reads
// the activations and the output gradients B kept, model/gpt_backward.cu); the executor lends a
// free slot to a (micro-batch, chunk) at its first action in the list (the receive of its input,
// or its forward) and takes it back after the last (the send of its input gradient, its backward
// or its weight pass). A rank needs as many slots as that rule holds at its peak
// (pipeline_slots): the schedule's peak of chunk forwards in flight (1f1b: pp - rank at most,
// whatever m is), plus what the message placement receives early or sends late.
//
// Gradient buffers. A slot's residual-stream gradient is live for a shorter time than its
// activations: from the receive of its output gradient (or, on the last stage, the forward,
// whose head writes it; or, in the V order, the next chunk's backward on this rank, which copies
// it in) to the send of its input gradient (or its backward on stage 0, or its weight pass
// there when split: the embedding's backward reads it). So the gradients are a pool of their
// own, pipeline_grad_buffers of them, lent the same way; the buffer a send in a run of messages
// frees is lent again only after the run (a receive in the same run must not write it). Both
// pools are keyed by what they hold: a (micro-batch, chunk) of this rank.
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
// Measured bubble. Every compute action is timed with events (host clock on the CPU backend),
// read only when a report is due: a step never waits on the host for its timing.
// pipeline_report (parallel/pipeline_report.cu) gathers the timings of the pp group, compares the
// idle fraction with the bubble the simulator predicts from those durations and with the
// formula, and draws the step as an ASCII timeline.
#include "parallel/pipeline.h"

#include <algorithm>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "kernels/common.h"
#include "kernels/trace.h"

namespace {

// ---------------------------------------------------------------------------------------------
// What the executor holds: two pools of buffers, each buffer lent to one (micro-batch, chunk)
// ---------------------------------------------------------------------------------------------
// A (micro-batch, chunk) of this rank: what an activation slot or a gradient buffer holds.
struct MicroChunk {
  int micro = 0, chunk = 0;
  bool operator<(const MicroChunk& o) const {
    return chunk != o.chunk ? chunk < o.chunk : micro < o.micro;
  }
  bool operator==(const MicroChunk& o) const { return micro == o.micro && chunk == o.chunk; }
};
MicroChunk micro_chunk(const PipeAction& a) { return {a.micro, a.chunk}; }

// Buffers 0..n-1 (the model's activation slots, or its gradient buffers), each lent to one
// (micro-batch, chunk) at a time.
struct BufferPool {
  const char* what = "";  // "activation slot" or "gradient buffer", for the errors
  std::vector<int> free;  // the last one is lent next
  std::map<MicroChunk, int> lent;
};

// When each (micro-batch, chunk) takes a buffer of a pool and gives it back: per action of the
// list, those whose first use is there (take) and those whose last use is there (give).
struct Lending {
  std::vector<std::vector<MicroChunk>> take, give;
};

// Which gradients an action uses: its own (micro-batch, chunk)'s, and a Backward also the
// previous stage's when that stage is on this rank too (the top of the file).
struct GradUse {
  std::optional<MicroChunk> own, local;
};

// Defined below the executor: the pool's operations and the lending rules.
BufferPool pool_of(const char* what, int n);
int held(const BufferPool& pool, MicroChunk k);  // the buffer k holds
// The buffer of k at action i: taken from the pool when i is k's first use, else the one it holds.
int lend(BufferPool& pool, const Lending& l, size_t i, MicroChunk k);
void give_back(BufferPool& pool, const Lending& l, size_t i);  // those whose last use is i
Lending slot_lending(const std::vector<PipeAction>& list);
Lending grad_lending(const PipelineSchedule& s, int rank, const std::vector<PipeAction>& list);
GradUse grad_use(const PipelineSchedule& s, int rank, const PipeAction& a);
// The chunk of this rank that holds the stage before action a's, or -1 (below).
int local_neighbour(const PipelineSchedule& s, int rank, const PipeAction& a);

// ---------------------------------------------------------------------------------------------
// The executor
// ---------------------------------------------------------------------------------------------
struct Executor {
  const PipelineSchedule& sched;
  const std::vector<PipeAction>& list;  // this rank's actions
  const PipelineStages& stages;
  Comm& comm;
  ops::Stream s;
  BufferPool slots, grads;
  Lending slot_lending, grad_lending;  // grad_lending empty: no gradients (a forward-only pass)
  std::vector<char> last_of_chunk;     // per action: no later action of its op on its chunk
};

// The steps of a list, in order: a compute action alone, or a run of sends and receives
// (pipeline_comm_runs: the one grouping rule, shared with the simulator), as [begin, end).
std::vector<std::pair<size_t, size_t>> steps_of(const std::vector<PipeAction>& list) {
  const std::vector<std::pair<size_t, size_t>> runs = pipeline_comm_runs(list);
  std::vector<std::pair<size_t, size_t>> steps;
  size_t r = 0;
  for (size_t i = 0; i < list.size();) {
    const bool run = r < runs.size() && runs[r].first == i;
    steps.push_back(run ? runs[r++] : std::make_pair(i, i + 1));
    i = steps.back().second;
  }
  return steps;
}

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

Executor executor(const PipelineSchedule& sched, const std::vector<PipeAction>& list,
                  const PipelineStages& stages, Comm& comm, int slots, ops::Stream s) {
  Executor ex{sched, list, stages, comm, s, pool_of("activation slot", slots), {}, {}, {}, {}};
  ex.slot_lending = slot_lending(list);
  ex.last_of_chunk = last_of_chunk(list);
  return ex;
}

// Posts the run of communication actions [begin, end) as one p2p_batch, each message on its
// channel's tag, sends first. A slot whose last use is a send in the run is free for a receive
// in it: the receive writes a slot's input, never the gradient being sent, and whatever writes
// that gradient next is ordered after this call. The gradient buffers come back after the run.
void communicate(Executor& ex, size_t begin, size_t end) {
  std::vector<P2POp> ops;
  for (int sends = 1; sends >= 0; sends--)
    for (size_t j = begin; j < end; j++) {
      const PipeAction& a = ex.list[j];
      if (pipe_op_is_send(a.op) != (sends == 1)) continue;
      const MicroChunk k = micro_chunk(a);
      const int slot = lend(ex.slots, ex.slot_lending, j, k);
      const int at =
          pipe_op_is_forward_message(a.op) ? slot : lend(ex.grads, ex.grad_lending, j, k);
      ops.push_back({sends == 1, ex.stages.boundary(a, at), ex.stages.boundary_count, a.peer,
                     pipeline_channel(ex.sched, ex.comm.rank, a)});
      give_back(ex.slots, ex.slot_lending, j);
    }
  p2p_batch(ex.comm, ops.data(), (int)ops.size(), ex.stages.dt, ex.s);
  for (size_t j = begin; j < end; j++) give_back(ex.grads, ex.grad_lending, j);
}

// A compute action on the slot (and gradient buffers) of its (micro-batch, chunk).
void compute(Executor& ex, size_t i) {
  const PipeAction& a = ex.list[i];
  ComputeCall call;
  call.action = a;
  call.slot = lend(ex.slots, ex.slot_lending, i, micro_chunk(a));
  call.next = next_weighted(ex.list, i);
  call.split = ex.sched.split;
  call.last_of_chunk = ex.last_of_chunk[i];
  const int prev = local_neighbour(ex.sched, ex.comm.rank, a);
  if (prev >= 0) call.local_slot = held(ex.slots, {a.micro, prev});
  if (!ex.grad_lending.take.empty()) {
    const GradUse g = grad_use(ex.sched, ex.comm.rank, a);
    if (g.own) call.grad = lend(ex.grads, ex.grad_lending, i, *g.own);
    if (g.local) call.local_grad = lend(ex.grads, ex.grad_lending, i, *g.local);
  }
  {
    trace::Span span(trace::Lane::Compute, "pipeline", pipe_op_name(a.op), ex.s);  // kernels/trace.h
    span.arg("micro", a.micro);
    span.arg("chunk", a.chunk);
    ex.stages.compute(call);
  }
  give_back(ex.slots, ex.slot_lending, i);
  give_back(ex.grads, ex.grad_lending, i);
}

}  // namespace

// One training step: every step of the list in order, each compute action between two events.
void pipeline_run(Pipeline& pl, const PipelineStages& stages, ops::Stream s) {
  const std::vector<PipeAction>& list = pl.schedule.ranks[pl.comm->rank];
  Executor ex = executor(pl.schedule, list, stages, *pl.comm, pl.slots, s);
  ex.grads = pool_of("gradient buffer", pl.grads);
  ex.grad_lending = grad_lending(pl.schedule, pl.comm->rank, list);
  const bool timed = !pl.count_only && !pl.untimed;
  if (timed) ops::event_record(pl.events[0], s);
  pl.computed.clear();
  size_t e = 1;
  for (const auto& [begin, end] : steps_of(list)) {
    if (pipe_op_is_comm(list[begin].op)) {
      communicate(ex, begin, end);
      continue;
    }
    if (timed) ops::event_record(pl.events[e++], s);
    compute(ex, begin);
    if (timed) ops::event_record(pl.events[e++], s);
    pl.computed.push_back(list[begin]);
  }
}

// The last step's timings from its events: waits for the last one (on the host), so only a
// report calls it (pipeline_report), never a step.
void pipeline_read_timing(Pipeline& pl) {
  pl.timing.clear();
  if (pl.count_only || pl.untimed || pl.computed.empty()) return;
  ops::event_sync(pl.events[2 * pl.computed.size()]);
  for (size_t k = 0; k < pl.computed.size(); k++)
    pl.timing.push_back({pl.computed[k],
                         ops::event_elapsed_ms(pl.events[0], pl.events[1 + 2 * k]),
                         ops::event_elapsed_ms(pl.events[0], pl.events[2 + 2 * k])});
}

// One micro-batch forward: each chunk receives its input, runs, sends its output, on a slot of
// its own kept to the end (no backward gives it back).
void pipeline_forward(const Pipeline& pl, const PipelineStages& stages, ops::Stream s) {
  const PipelineSchedule& sc = pl.schedule;
  const int r = pl.comm->rank, S = sc.p * sc.v;
  std::vector<PipeAction> list;
  for (int c = 0; c < sc.v; c++) {
    const int stage = sc.stage(r, c);
    if (stage > 0 && sc.owner(stage - 1) != r)
      list.push_back({PipeOp::RecvForward, 0, c, sc.owner(stage - 1)});
    list.push_back({PipeOp::Forward, 0, c, -1});
    if (stage < S - 1 && sc.owner(stage + 1) != r)
      list.push_back({PipeOp::SendForward, 0, c, sc.owner(stage + 1)});
  }
  CHECK(pl.slots >= sc.v, "pipeline: %d activation slots for %d chunks", pl.slots, sc.v);
  Executor ex = executor(sc, list, stages, *pl.comm, sc.v, s);
  ex.slot_lending.give.clear();  // a slot per chunk, kept to the end
  for (const auto& [begin, end] : steps_of(list)) {
    if (pipe_op_is_comm(list[begin].op)) communicate(ex, begin, end);
    else compute(ex, begin);
  }
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
  for (const PipeAction& a : schedule.ranks[group->rank]) computes += !pipe_op_is_comm(a.op);
  pl.events.resize(1 + 2 * computes);  // the start; each compute action: 2
  for (ops::Event& e : pl.events) e = ops::event_create();
}

void pipeline_destroy(Pipeline& pl) {
  for (ops::Event e : pl.events) ops::event_destroy(e);
  pl.events.clear();
}

// ---------------------------------------------------------------------------------------------
// The pools, and when they lend (the one rule the executor follows and the sizing counts with)
// ---------------------------------------------------------------------------------------------
namespace {

BufferPool pool_of(const char* what, int n) {
  BufferPool pool;
  pool.what = what;
  for (int i = n - 1; i >= 0; i--) pool.free.push_back(i);
  return pool;
}

int held(const BufferPool& pool, MicroChunk k) {
  auto it = pool.lent.find(k);
  if (it == pool.lent.end())
    BUG("pipeline: micro-batch %d chunk %d holds no %s", k.micro, k.chunk, pool.what);
  return it->second;
}

int lend(BufferPool& pool, const Lending& l, size_t i, MicroChunk k) {
  const std::vector<MicroChunk>& take = l.take[i];
  if (std::find(take.begin(), take.end(), k) == take.end()) return held(pool, k);
  if (pool.free.empty())
    BUG("pipeline: no free %s for micro-batch %d chunk %d", pool.what, k.micro, k.chunk);
  const int b = pool.free.back();
  pool.free.pop_back();
  pool.lent[k] = b;
  return b;
}

void give_back(BufferPool& pool, const Lending& l, size_t i) {
  if (l.give.empty()) return;  // nothing lent (a forward-only pass's gradients)
  for (const MicroChunk& k : l.give[i]) {
    pool.free.push_back(held(pool, k));
    pool.lent.erase(k);
  }
}

// The chunk of this rank whose slot (same micro-batch) compute action a uses besides its own:
// the previous stage's, when it is on this rank too (rank p-1 of the V order, or p = 1). A
// forward copies its input from that slot's output; a backward copies its input gradient into
// that slot's gradient, where the previous stage's backward reads it. Either way that slot is
// held already (its backward comes later). -1: none.
int local_neighbour(const PipelineSchedule& s, int rank, const PipeAction& a) {
  if (a.op != PipeOp::Forward && a.op != PipeOp::Backward) return -1;
  const int stage = s.stage(rank, a.chunk) - 1;
  if (stage < 0 || s.owner(stage) != rank) return -1;
  return s.chunk_of(stage);
}

GradUse grad_use(const PipelineSchedule& s, int rank, const PipeAction& a) {
  const bool last_stage = s.stage(rank, a.chunk) == s.p * s.v - 1;
  const bool first_stage = s.stage(rank, a.chunk) == 0;
  const int prev = local_neighbour(s, rank, a);
  GradUse use;
  const bool own = a.op == PipeOp::RecvBackward || a.op == PipeOp::SendBackward ||
                   a.op == PipeOp::Backward ||
                   (a.op == PipeOp::Forward && last_stage) ||  // the head writes it
                   (a.op == PipeOp::Weight && first_stage);    // the embedding's backward reads it
  if (own) use.own = micro_chunk(a);
  if (a.op == PipeOp::Backward && prev >= 0) use.local = MicroChunk{a.micro, prev};
  return use;
}

// From what each action of a list uses: each (micro-batch, chunk) takes a buffer at its first
// use and gives it back at its last.
Lending lending_of(const std::vector<std::vector<MicroChunk>>& uses) {
  Lending l{std::vector<std::vector<MicroChunk>>(uses.size()),
            std::vector<std::vector<MicroChunk>>(uses.size())};
  std::map<MicroChunk, size_t> first, last;
  for (size_t i = 0; i < uses.size(); i++)
    for (const MicroChunk& k : uses[i]) {
      if (!first.count(k)) first[k] = i;
      last[k] = i;
    }
  for (const auto& [k, i] : first) l.take[i].push_back(k);
  for (const auto& [k, i] : last) l.give[i].push_back(k);
  return l;
}

// Activation slots: every action of a (micro-batch, chunk) uses its slot, from the receive of its
// input (or its forward on stage 0) to the send of its input gradient (or its backward, or its
// weight pass when split).
Lending slot_lending(const std::vector<PipeAction>& list) {
  std::vector<std::vector<MicroChunk>> uses;
  for (const PipeAction& a : list) uses.push_back({micro_chunk(a)});
  return lending_of(uses);
}

Lending grad_lending(const PipelineSchedule& s, int rank, const std::vector<PipeAction>& list) {
  std::vector<std::vector<MicroChunk>> uses;
  for (const PipeAction& a : list) {
    const GradUse g = grad_use(s, rank, a);
    uses.emplace_back();
    if (g.own) uses.back().push_back(*g.own);
    if (g.local) uses.back().push_back(*g.local);
  }
  return lending_of(uses);
}

// The most buffers lent at once, going through the steps in order: a step takes all it takes
// before it gives.
int peak_lent(const Lending& l, const std::vector<std::pair<size_t, size_t>>& steps) {
  int live = 0, peak = 1;
  for (const auto& [begin, end] : steps) {
    for (size_t i = begin; i < end; i++) live += (int)l.take[i].size();
    peak = std::max(peak, live);
    for (size_t i = begin; i < end; i++) live -= (int)l.give[i].size();
  }
  return peak;
}

}  // namespace

// A slot comes back after each action (a receive may reuse the slot a send in its run frees),
// so the slots peak action by action; the gradient buffers come back after each run.
int pipeline_slots(const PipelineSchedule& s, int rank) {
  const std::vector<PipeAction>& list = s.ranks[rank];
  std::vector<std::pair<size_t, size_t>> each;
  for (size_t i = 0; i < list.size(); i++) each.push_back({i, i + 1});
  return peak_lent(slot_lending(list), each);
}

int pipeline_grad_buffers(const PipelineSchedule& s, int rank) {
  const std::vector<PipeAction>& list = s.ranks[rank];
  return peak_lent(grad_lending(s, rank, list), steps_of(list));
}
