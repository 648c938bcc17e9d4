// parallel/param_store.cu - the parts of the ParamStore that do not depend on how weights are
// distributed: shards, filling them from a ParamFill, zeroing gradients, when the partial
// gradients are summed over tp (parallel/tensor_parallel.cu sums them), the global gradient norm,
// and the dispatch to DDP (parallel/ddp.cu) or FSDP (parallel/fsdp.cu).
//
// Shard geometry (shard_range, parallel/placement.h). A unit of `numel` elements is padded to a
// multiple of group size * kTensorAlign, and rank r of the unit's group owns the r-th slice. The
// padding is zero in the weights, the gradients and both moments, and AdamW keeps it zero (g = 0
// -> no update), so it never shows in a norm or a checkpoint. Replicated mode is the same with
// one shard.
#include "parallel/param_store.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "parallel/tensor_parallel.h"

// Writes this rank's shard of unit `u` (host memory, shard_numel floats) from `fill`, one
// global block of each tensor at a time.
static void fill_shard(const ParamUnit& pu, const UnitState& us, const ParamFill& fill,
                       float* host) {
  std::fill(host, host + us.shard_numel, 0.0f);
  const FlatRange shard{us.shard_offset, us.shard_offset + us.shard_numel};
  for (const TensorPlacement& t : pu.tensors)
    for (const Block& b : blocks_in_range(t, shard)) fill(t, b, host + (b.local - shard.first));
}

const char* state_kind_name(StateKind k) {
  return k == StateKind::Master ? "model" : k == StateKind::AdamM ? "optim/m" : "optim/v";
}

float* store_state(ParamStore& st, int unit, StateKind k) {
  UnitState& us = st.units[unit];
  return k == StateKind::Master ? us.master : k == StateKind::AdamM ? us.adam_m : us.adam_v;
}

void param_store_load(ParamStore& st, const std::vector<ParamUnit>& units,
                      const ParamFill& fill, StateKind kind) {
  std::vector<float> host;
  for (size_t u = 0; u < st.units.size(); u++) {
    UnitState& us = st.units[u];
    host.resize(us.shard_numel);
    fill_shard(units[u], us, fill, host.data());
    ops::copy_to_device(store_state(st, (int)u, kind), host.data(),
                        us.shard_numel * sizeof(float));
    if (kind == StateKind::Master && store_needs_param_copy(st))
      ops::cast(store_param_copy(st, (int)u), st.dt, us.master, DType::F32, us.shard_numel,
                st.compute);
  }
  ops::stream_sync(st.compute);
}

void param_store_init(ParamStore& st, const std::vector<ParamUnit>& units, ShardingMode mode,
                      DType dt, const CommsByAxis& comms, ops::Stream compute, ops::Stream comm,
                      const ParamFill& fill) {
  st.mode = mode;
  st.dt = dt;
  st.tp = comms[Axis::TP];
  st.world = comms[Axis::World];
  st.embed = comms[Axis::Embed];
  st.compute = compute;
  st.comm = comm;
  st.pool_slots = fsdp_pool_slots(units);
  st.state_memory.count_only = st.work_memory.count_only = st.count_only;
  const bool sharded = mode == ShardingMode::FSDP;
  auto zeroed = [&](size_t n) {
    return (float*)allocate_zeroed(st.state_memory, n * sizeof(float), compute);
  };
  for (const ParamUnit& pu : units) {
    UnitState us;
    us.group = comms[pu.grad_axis];
    CHECK(us.group && st.tp && st.world, "param store: the mesh has no %s group",
          axis_name(pu.grad_axis));
    us.numel = pu.numel;
    us.owned_end = owned_end(pu, st.tp->rank);
    us.partial_begin = pu.partial_begin;
    us.whole_step = pu.whole_step;
    us.tied = pu.tied;
    const int ranks = sharded ? us.group->size : 1, rank = sharded ? us.group->rank : 0;
    us.padded_numel = sharded ? padded_numel(pu.numel, ranks) : pu.numel;
    const FlatRange shard = sharded ? shard_range(pu.numel, rank, ranks) : FlatRange{0, pu.numel};
    us.shard_offset = shard.first;
    us.shard_numel = shard.size();
    us.master = zeroed(us.shard_numel);
    us.adam_m = zeroed(us.shard_numel);
    us.adam_v = zeroed(us.shard_numel);
    us.grad = zeroed(us.shard_numel);
    st.units.push_back(us);
  }
  st.norm_scratch = (float*)allocate_zeroed(st.work_memory, sizeof(float), compute);
  st.comm_idle = allocate_event(st.work_memory);
  if (sharded) fsdp_init(st);
  else ddp_init(st);
  if (!st.count_only) param_store_load(st, units, fill);
}

void param_store_destroy(ParamStore& st) {
  ops::stream_sync(st.compute);
  ops::stream_sync(st.comm);
  allocator_free(st.state_memory);
  allocator_free(st.work_memory);
  st.units.clear();
}

// ---------------------------------------------------------------------------------------------
// Dispatch
// ---------------------------------------------------------------------------------------------
void* params_acquire(ParamStore& st, int unit) {
  return st.mode == ShardingMode::FSDP ? fsdp_params_acquire(st, unit)
                                       : ddp_params_acquire(st, unit);
}
void params_prefetch(ParamStore& st, int unit) {
  if (st.mode == ShardingMode::FSDP && unit >= 0) fsdp_params_prefetch(st, unit);
}
void params_release(ParamStore& st, int unit) {
  if (st.mode == ShardingMode::FSDP) fsdp_params_release(st, unit);
}
float* grads_acquire(ParamStore& st, int unit) {
  return st.mode == ShardingMode::FSDP ? fsdp_grads_acquire(st, unit)
                                       : ddp_grads_acquire(st, unit);
}
void grads_release(ParamStore& st, int unit, bool last_micro_step) {
  if (st.mode == ShardingMode::FSDP) fsdp_grads_release(st, unit, last_micro_step);
  else ddp_grads_release(st, unit, last_micro_step);
}

// ---------------------------------------------------------------------------------------------
// Gradients as the optimizer sees them
// ---------------------------------------------------------------------------------------------
void grads_zero(ParamStore& st) {
  for (UnitState& us : st.units) ops::fill_zero(us.grad, us.shard_numel * sizeof(float), st.compute);
}

// Once the step's gradients are summed over each unit's group, the tp ranks' partial gradients
// (sequence parallelism: what and why in parallel/tensor_parallel.cu) are summed over tp, one
// all-reduce per unit. They wait for the whole backward first: the model's own tp collectives run
// on the compute stream, and two streams must never interleave collectives of one communicator
// (NCCL could deadlock).
static void sum_partial_grads_over_tp(ParamStore& st) {
  for (UnitState& us : st.units)
    tp_sum_partial_grads(*st.tp, us.grad, {us.shard_offset, us.shard_offset + us.shard_numel},
                         us.partial_begin, us.numel, st.comm);
}

// Pipeline parallelism: the first and the last stage each hold the root (the tied wte); each
// computed part of its gradient (embedding lookups at the first, the head at the last, zeros
// elsewhere), so one all-reduce of the root's gradient shard over the pair gives both the full
// gradient, and the same AdamW step keeps the two copies bitwise equal. The two hold the same
// unit geometry, so under FSDP their shards line up element for element.
static void sum_tied_grads(ParamStore& st) {
  for (UnitState& us : st.units)
    if (us.tied) all_reduce_sum(*st.embed, us.grad, us.shard_numel, DType::F32, st.comm);
}

void grads_wait(ParamStore& st) {
  if (st.tp->size > 1 || (st.embed && st.embed->size > 1)) {
    ops::event_record(st.comm_idle, st.compute);  // the whole backward is queued
    ops::stream_wait_event(st.comm, st.comm_idle);
  }
  if (st.embed && st.embed->size > 1) sum_tied_grads(st);
  if (st.tp->size > 1) sum_partial_grads_over_tp(st);
  ops::event_record(st.comm_idle, st.comm);
  ops::stream_wait_event(st.compute, st.comm_idle);
}

// Each logical element once: over tp the elements this rank owns (placement.h: owned_end); FSDP
// shards are disjoint, DDP replicas count on group rank 0 only.
double grad_norm(ParamStore& st) {
  ops::fill_zero(st.norm_scratch, sizeof(float), st.compute);
  for (UnitState& us : st.units) {
    // A replicated (DDP) unit is counted by its group's rank 0 only; a sharded one by every rank.
    // Units differ in group (experts: ep-dp), so this is decided per unit.
    if (st.mode != ShardingMode::FSDP && us.group->rank != 0) continue;
    const size_t lo = us.shard_offset, end = std::min(lo + us.shard_numel, us.owned_end);
    if (end > lo) ops::sum_squares_accumulate(st.norm_scratch, us.grad, end - lo, st.compute);
  }
  float local = 0;
  ops::stream_sync(st.compute);
  ops::copy_to_host(&local, st.norm_scratch, sizeof(float));
  return std::sqrt(all_reduce_host_sum(*st.world, (double)local));
}

bool tied_copies_equal(ParamStore& st) {
  bool equal = true;
  for (UnitState& us : st.units) {
    if (!us.tied || st.embed->size < 2) continue;
    const size_t n = us.shard_numel, bytes = n * sizeof(float);
    float* theirs = (float*)ops::alloc(bytes);
    const int peer = 1 - st.embed->rank;
    ops::stream_sync(st.compute);
    send_recv(*st.embed, us.master, n, peer, theirs, n, peer, DType::F32, st.compute);
    std::vector<float> a(n), b(n);
    ops::stream_sync(st.compute);
    ops::copy_to_host(a.data(), us.master, bytes);
    ops::copy_to_host(b.data(), theirs, bytes);
    ops::release(theirs);
    equal = equal && std::memcmp(a.data(), b.data(), bytes) == 0;
  }
  return all_agree(*st.world, equal);
}

bool store_needs_param_copy(const ParamStore& st) { return st.dt != DType::F32; }

void* store_param_copy(ParamStore& st, int unit) {
  UnitState& us = st.units[unit];
  return st.mode == ShardingMode::FSDP ? us.param_shard : us.params;
}
