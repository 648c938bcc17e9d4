// parallel/param_store.cu - the parts of the ParamStore that do not depend on how weights are
// distributed: shards, where the optimizer state lives, filling it from a ParamFill, zeroing
// gradients, when the partial gradients are summed over tp (parallel/tensor_parallel.cu sums
// them), the global gradient norm, the optimizer's view of a shard, the plain bucket reductions,
// and the dispatch to DDP (parallel/ddp.cu), ZeRO-1/2 (parallel/zero.cu), FSDP (parallel/fsdp.cu),
// the sharded gradients (parallel/sharded_grads.cu) and the side roads: optimizer offload
// (parallel/offload.cu), compressed reductions (parallel/grad_compression.cu), the small-batch
// norm (parallel/small_batch_norm.cu) and DiLoCo's outer state (parallel/diloco.cu).
//
// Shard geometry (shard_range, parallel/placement.h). A unit of `numel` elements is padded to a
// multiple of group size * kTensorAlign, and rank r of the unit's group owns the r-th slice. The
// padding is zero in the weights, the gradients and both moments, and AdamW keeps it zero (g = 0
// -> no update), so it never shows in a norm or a checkpoint. Replicated mode is the same with
// one shard. Every ZeRO stage uses this one geometry, so a checkpoint written at one stage is
// read by any other.
#include "parallel/param_store.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/host_adamw.h"
#include "parallel/tensor_parallel.h"

ShardingMode sharding_mode(int zero) {
  CHECK(zero >= 0 && zero <= 3, "[parallel] zero = %d: expected 0, 1, 2 or 3", zero);
  return (ShardingMode)zero;
}

const char* sharding_mode_name(ShardingMode m) {
  switch (m) {
    case ShardingMode::Replicated: return "replicated (DDP)";
    case ShardingMode::ZeRO1: return "ZeRO-1";
    case ShardingMode::ZeRO2: return "ZeRO-2";
    case ShardingMode::FSDP: return "FSDP (ZeRO-3)";
  }
  BUG("sharding mode %d", (int)m);
}

OffloadKind offload_kind(const std::string& s) {
  if (s == "none" || s.empty()) return OffloadKind::None;
  if (s == "cpu") return OffloadKind::Cpu;
  if (s == "nvme") return OffloadKind::Nvme;
  BUG("[train] optimizer_offload = \"%s\"", s.c_str());
}

ShardingMode store_options(ParamStore& st, const Config& cfg) {
  st.offload.kind = offload_kind(cfg.train.optimizer_offload);
  st.offload.dir = cfg.train.offload_dir;
  st.compression.compressor.kind = grad_compression_kind(cfg.parallel.grad_compression);
  st.compression.compressor.topk_ratio = cfg.parallel.topk_ratio;
  st.small_batch.on = cfg.log.grad_noise_scale;
  st.reduce_dt = reduce_dtype(cfg.parallel.reduce_dtype);
  st.bucket_mb = cfg.parallel.bucket_mb;
  st.fsdp_prefetch = cfg.parallel.fsdp_prefetch;
  return sharding_mode(cfg.parallel.zero);
}

bool store_offloaded(const ParamStore& st) { return st.offload.kind != OffloadKind::None; }
bool store_compressed(const ParamStore& st) {
  return st.compression.compressor.kind != GradCompression::None;
}

// ZeRO-1/2 keep full weights that each rank updates a shard of: after an update (or a load) every
// rank's new shard is all-gathered.
static bool gathers_weights(const ParamStore& st) {
  return st.mode == ShardingMode::ZeRO1 || st.mode == ShardingMode::ZeRO2;
}

// Writes this rank's shard of unit `u` (host memory, shard_numel floats) from `fill`, one
// global block of each tensor at a time.
static void fill_shard(const ParamUnit& pu, const UnitState& us, const ParamFill& fill,
                       float* host) {
  std::fill(host, host + us.shard_numel, 0.0f);
  const FlatRange shard{us.shard_offset, us.shard_offset + us.shard_numel};
  for (const TensorPlacement& t : pu.tensors)
    for (const Block& b : blocks_in_range(t, shard)) fill(t, b, host + (b.local - shard.first));
}

static float* device_state(ParamStore& st, int unit, StateKind k) {
  UnitState& us = st.units[unit];
  switch (k) {
    case StateKind::Master: return us.master;
    case StateKind::AdamM: return us.adam_m;
    case StateKind::AdamV: return us.adam_v;
    case StateKind::OuterSync: return st.outer.sync[unit];
    case StateKind::OuterMomentum: return st.outer.momentum[unit];
  }
  return nullptr;
}

void store_state_read(ParamStore& st, int unit, StateKind k, size_t first, size_t count,
                      float* host) {
  UnitState& us = st.units[unit];
  CHECK(first >= us.shard_offset && first + count <= us.shard_offset + us.shard_numel,
        "unit %d range [%zu, %zu) is not inside this rank's shard [%zu, %zu)", unit, first,
        first + count, us.shard_offset, us.shard_offset + us.shard_numel);
  CHECK(!is_outer_state(k) || st.outer.on(), "unit %d: no DiLoCo state (diloco_islands = 0)", unit);
  if (store_offloaded(st) && !is_outer_state(k))
    return offload_state_read(st, unit, k, first, count, host);
  const float* src = device_state(st, unit, k) + (first - us.shard_offset);
  if (store_offloaded(st))  // DiLoCo's outer state lives with the master, in host memory
    return (void)std::memcpy(host, src, count * sizeof(float));
  ops::copy_to_host(host, src, count * sizeof(float));
}

// The working copy of unit u's shard from its fp32 master (host): rounded to the compute dtype
// on the host (nearest even, as the device's cast) and copied up. In fp32 without offload the
// master is the working copy: nothing to do.
static void upload_working_copy(ParamStore& st, int unit, const float* master) {
  UnitState& us = st.units[unit];
  if (st.dt == DType::F32 && !store_offloaded(st)) return;
  std::vector<uint16_t> bf16;
  const void* src = master;
  if (st.dt == DType::BF16) {
    bf16.resize(us.shard_numel);
    for (size_t i = 0; i < us.shard_numel; i++) bf16[i] = f32_to_bf16(master[i]);
    src = bf16.data();
  }
  ops::copy_to_device(us.param_shard, src, us.shard_numel * dtype_size(st.dt));
}

void param_store_load(ParamStore& st, const std::vector<ParamUnit>& units,
                      const ParamFill& fill, StateKind kind) {
  std::vector<float> host;
  for (size_t u = 0; u < st.units.size(); u++) {
    UnitState& us = st.units[u];
    host.resize(us.shard_numel);
    fill_shard(units[u], us, fill, host.data());
    CHECK(!is_outer_state(kind) || st.outer.on(), "unit %zu: no DiLoCo state to load", u);
    const size_t bytes = us.shard_numel * sizeof(float);
    if (store_offloaded(st) && !is_outer_state(kind))
      offload_state_write(st, (int)u, kind, host.data());
    else if (store_offloaded(st))  // DiLoCo's outer state: host memory (parallel/diloco.cu)
      std::memcpy(device_state(st, (int)u, kind), host.data(), bytes);
    else
      ops::copy_to_device(device_state(st, (int)u, kind), host.data(), bytes);
    if (kind == StateKind::Master) upload_working_copy(st, (int)u, host.data());
  }
  if (kind == StateKind::Master && gathers_weights(st)) zero_gather_weights(st);
  ops::stream_sync(st.compute);
  ops::stream_sync(st.comm);
}

// The fp32 master and moments on the device. In fp32 the master is the working copy's shard.
static void device_optimizer_state(ParamStore& st) {
  auto zeroed = [&](size_t n) {
    return (float*)allocate_zeroed(st.state_memory, n * sizeof(float), st.compute);
  };
  for (UnitState& us : st.units) {
    us.master = st.dt == DType::F32 ? (float*)us.param_shard : zeroed(us.shard_numel);
    us.adam_m = zeroed(us.shard_numel);
    us.adam_v = zeroed(us.shard_numel);
  }
}

// Each unit's place: its group, its shard, its ranges.
static UnitState unit_geometry(const ParamStore& st, const ParamUnit& pu, const CommsByAxis& comms) {
  UnitState us;
  us.group = comms[shard_axis(pu)];
  CHECK(us.group && st.tp && st.world, "param store: the mesh has no %s group",
        axis_name(shard_axis(pu)));
  if (pu.grad_replicas > 1) {  // HSDP (parallel/hsdp.cu)
    us.replica = comms[replica_axis(pu)];
    CHECK(us.replica && us.replica->size == pu.grad_replicas,
          "param store: the mesh has no %s group of %d ranks", axis_name(replica_axis(pu)),
          pu.grad_replicas);
  }
  us.numel = pu.numel;
  us.owned_end = owned_end(pu, st.tp->rank);
  us.partial_begin = us.tp_sum_begin = pu.partial_begin;
  us.replicated_begin = std::min(round_up(pu.split_numel, kTensorAlign), pu.numel);
  us.whole_step = pu.whole_step;
  us.tied = pu.tied;
  const bool sharded = st.mode != ShardingMode::Replicated;
  const int ranks = sharded ? us.group->size : 1, rank = sharded ? us.group->rank : 0;
  us.padded_numel = sharded ? padded_numel(pu.numel, ranks) : pu.numel;
  const FlatRange shard = sharded ? shard_range(pu.numel, rank, ranks) : FlatRange{0, pu.numel};
  us.shard_offset = shard.first;
  us.shard_numel = shard.size();
  return us;
}

void param_store_init(ParamStore& st, const std::vector<ParamUnit>& units, ShardingMode mode,
                      DType dt, const CommsByAxis& comms, ops::Stream compute, ops::Stream comm,
                      const ParamFill& fill) {
  st.mode = mode;
  st.dt = dt;
  st.tp = comms[Axis::TP];
  st.world = comms[Axis::World];
  st.embed = comms[Axis::Embed];
  if (st.world_rank < 0) st.world_rank = st.world ? st.world->rank : 0;
  st.compute = compute;
  st.comm = comm;
  st.reduction = plain_bucket_reduction();
  st.pool_slots = fsdp_pool_slots(units);
  st.state_memory.count_only = st.work_memory.count_only = st.count_only;
  st.offload.memory.count_only = st.count_only;
  CHECK(!store_offloaded(st) || mode != ShardingMode::Replicated,
        "optimizer offload needs a ZeRO stage ([parallel] zero = 1, 2 or 3)");
  for (const ParamUnit& pu : units) st.units.push_back(unit_geometry(st, pu, comms));
  if (store_offloaded(st)) offload_init(st);  // first: a full offload_dir stops us here
  switch (mode) {
    case ShardingMode::Replicated: ddp_init(st); break;
    case ShardingMode::ZeRO1:
    case ShardingMode::ZeRO2: zero_init(st); break;
    case ShardingMode::FSDP: fsdp_init(st); break;
  }
  if (!store_offloaded(st)) device_optimizer_state(st);
  grad_compression_init(st);  // the compressed BucketReduction
  grad_buckets_init(st, units);
  reduce_dtype_init(st);
  const int world = st.world ? st.world->size : 1;
  st.norm_parts = (float*)allocate_zeroed(st.work_memory, (1 + world) * sizeof(float), compute);
  st.norm = (double*)allocate_zeroed(st.work_memory, sizeof(double), compute);
  st.clip_factor = (float*)allocate_zeroed(st.work_memory, sizeof(float), compute);
  small_batch_init(st, comms);
  st.comm_idle = allocate_event(st.work_memory);
  st.issue_point = allocate_event(st.work_memory);
  if (!st.count_only) param_store_load(st, units, fill);
}

void param_store_destroy(ParamStore& st) {
  ops::stream_sync(st.compute);
  ops::stream_sync(st.comm);
  if (store_offloaded(st)) offload_destroy(st);
  allocator_free(st.state_memory);
  allocator_free(st.work_memory);
  st.units.clear();
}

void store_stats_reset(ParamStore& st) { st.offload.stats = OffloadStats{}; }

// ---------------------------------------------------------------------------------------------
// Dispatch
// ---------------------------------------------------------------------------------------------
void* params_acquire(ParamStore& st, int unit) {
  switch (st.mode) {
    case ShardingMode::Replicated: return ddp_params_acquire(st, unit);
    case ShardingMode::ZeRO1:
    case ShardingMode::ZeRO2: return zero_params_acquire(st, unit);
    case ShardingMode::FSDP: return fsdp_params_acquire(st, unit);
  }
  BUG("sharding mode %d", (int)st.mode);
}
void params_prefetch(ParamStore& st, int unit) {
  if (st.mode == ShardingMode::FSDP && unit >= 0) fsdp_params_prefetch(st, unit);
}
void params_release(ParamStore& st, int unit) {
  if (st.mode == ShardingMode::FSDP) fsdp_params_release(st, unit);
}
// DDP and ZeRO-1 accumulate the micro-steps in a full gradient; ZeRO-2 and FSDP reduce-scatter
// each micro-step's bucket into the shard.
float* grads_acquire(ParamStore& st, int unit) {
  const bool full = st.mode == ShardingMode::Replicated || st.mode == ShardingMode::ZeRO1;
  return full ? ddp_grads_acquire(st, unit) : sharded_grads_acquire(st, unit);
}

// A unit's gradient shard is final once its last reduction is queued, unless a sum at the end
// of the step remains (the tied embedding's over the pair of stages, the partial gradients'
// over tp): those go to the host from grads_wait.
static bool summed_at_step_end(const ParamStore& st, const UnitState& us) {
  return (us.tied && st.embed && st.embed->size > 1) ||
         (st.tp->size > 1 && us.tp_sum_begin < us.numel);
}

void grads_release(ParamStore& st, int unit, bool last_micro_step) {
  small_batch_on_release(st, unit);  // before its reduction ([log] grad_noise_scale)
  if (in_grad_bucket(st, unit)) return grad_bucket_release(st, unit, last_micro_step);
  switch (st.mode) {
    case ShardingMode::Replicated: ddp_grads_release(st, unit, last_micro_step); break;
    case ShardingMode::ZeRO1: zero1_grads_release(st, unit, last_micro_step); break;
    case ShardingMode::ZeRO2:
    case ShardingMode::FSDP: sharded_grads_release(st, unit); break;
  }
  if (last_micro_step) unit_grads_reduced(st, unit);
}

void unit_grads_reduced(ParamStore& st, int unit) {
  hsdp_reduce_replicas(st, unit);
  if (store_offloaded(st) && !summed_at_step_end(st, st.units[unit]))
    offload_grad_to_host(st, unit);
}

void grads_micro_batch_done(ParamStore& st) { small_batch_micro_batch_done(st); }

// The buckets are summed by the store's BucketReduction, chosen at param_store_init: these plain
// collectives, or grad_compression_init's compressed ones.
static void plain_all_reduce(ParamStore& st, int unit, float* bucket) {
  const UnitState& us = st.units[unit];
  grad_sum(st, *us.group, bucket, us.numel);  // in [parallel] reduce_dtype
}
static void plain_reduce_scatter(ParamStore& st, int unit, float* full, float* shard) {
  const UnitState& us = st.units[unit];
  grad_sum_scatter(st, *us.group, full, shard, us.shard_numel);
}
BucketReduction plain_bucket_reduction() { return {plain_all_reduce, plain_reduce_scatter}; }

void reduce_bucket(ParamStore& st, int unit, float* bucket) {
  st.reduction.all_reduce(st, unit, bucket);
}
void reduce_scatter_bucket(ParamStore& st, int unit, float* full, float* shard) {
  st.reduction.reduce_scatter(st, unit, full, shard);
}

// ---------------------------------------------------------------------------------------------
// Gradients as the optimizer sees them
// ---------------------------------------------------------------------------------------------
// Zeroes what the micro-steps accumulate into: the full gradient where it persists (DDP,
// ZeRO-1, padding included), else the shard.
void grads_zero(ParamStore& st) {
  small_batch_reset(st);
  for (UnitState& us : st.units) {
    if (st.mode == ShardingMode::ZeRO1)
      ops::fill_zero(us.grad_full, us.padded_numel * sizeof(float), st.compute);
    else ops::fill_zero(us.grad, us.shard_numel * sizeof(float), st.compute);
  }
}

// Once the step's gradients are summed over each unit's group, the tp ranks' partial gradients
// (sequence parallelism: what and why in parallel/tensor_parallel.cu) are summed over tp, one
// all-reduce per unit. They wait for the whole backward first: the model's own tp collectives run
// on the compute stream, and two streams must never interleave collectives of one communicator
// (NCCL could deadlock).
static void sum_partial_grads_over_tp(ParamStore& st) {
  for (UnitState& us : st.units)
    tp_sum_partial_grads(*st.tp, us.grad, {us.shard_offset, us.shard_offset + us.shard_numel},
                         us.tp_sum_begin, us.numel, st.comm);
}

// Pipeline parallelism: the first and the last stage each hold the root (the tied wte); each
// computed part of its gradient (embedding lookups at the first, the head at the last, zeros
// elsewhere), so one all-reduce of the root's gradient shard over the pair gives both the full
// gradient, and the same AdamW step keeps the two copies bitwise equal. The two hold the same
// unit geometry, so under any ZeRO stage their shards line up element for element.
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
  if (st.embed && st.embed->size > 1) small_batch_tied_sum(st);
  if (st.tp->size > 1) sum_partial_grads_over_tp(st);
  if (store_offloaded(st))
    for (size_t u = 0; u < st.units.size(); u++)
      if (summed_at_step_end(st, st.units[u])) offload_grad_to_host(st, (int)u);
  ops::event_record(st.comm_idle, st.comm);
  ops::stream_wait_event(st.compute, st.comm_idle);
  small_batch_tied_squares(st);
}

// Whether every member of `group` holds bit for bit the same master weights of unit u over
// `range`: the copies are gathered to every member and compared with the first. Collective over
// the group (the range has one size on every member, so an empty one skips the gather on all).
static bool master_copies_equal(ParamStore& st, int u, Comm& group, FlatRange range) {
  const size_t n = range.size();
  if (n == 0) return true;
  std::vector<float> all(group.size * n);
  float* own = all.data() + group.rank * n;
  store_state_read(st, u, StateKind::Master, range.first, n, own);
  all_gather_host(group, own, n * sizeof(float), all.data());
  bool equal = true;
  for (int r = 1; r < group.size; r++)
    equal = equal && std::memcmp(all.data() + r * n, all.data(), n * sizeof(float)) == 0;
  return equal;
}

bool tp_replicas_equal(ParamStore& st) {
  bool equal = true;
  ops::stream_sync(st.compute);
  for (size_t u = 0; u < st.units.size() && st.tp->size > 1; u++) {
    const UnitState& us = st.units[u];
    const FlatRange mine = clip({std::max(us.shard_offset, us.replicated_begin),
                                 us.shard_offset + us.shard_numel}, us.numel);
    equal = master_copies_equal(st, (int)u, *st.tp, mine) && equal;
  }
  return all_agree(*st.world, equal);
}

// Each logical element once: over tp the elements this rank owns (placement.h: owned_end), and
// over the unit's group each rank its shard (shard_range) - the one it updates at a ZeRO stage,
// and the same slice of the replicated gradient under DDP. So every stage sums the same squares
// in the same order, and a step's norm (and clipping) is bitwise the same at every stage. Under
// HSDP the replicas hold the same shards: the first replica counts them.
// The ranks' sums (one float each) are all-gathered over the world on the compute stream (control
// plane: not counted) and added in double by one device thread, which also writes the clipping
// factor (ops::grad_norm_and_clip): the host queues it all and waits for none of it.
void grad_norm(ParamStore& st, float grad_clip) {
  ops::fill_zero(st.norm_parts, sizeof(float), st.compute);
  for (UnitState& us : st.units) {
    if (us.replica && us.replica->rank != 0) continue;
    const FlatRange mine = clip(shard_range(us.numel, us.group->rank, us.group->size),
                                us.owned_end);
    if (mine.size() > 0)
      ops::sum_squares_accumulate(st.norm_parts, us.grad + (mine.first - us.shard_offset),
                                  mine.size(), st.compute);
  }
  all_gather_control(*st.world, st.norm_parts, st.norm_parts + 1, 1, st.compute);
  ops::grad_norm_and_clip(st.norm, st.clip_factor, st.norm_parts + 1, st.world->size, grad_clip,
                          st.compute);
}

double grad_norm_read(ParamStore& st) {
  double norm = 0;
  ops::stream_sync(st.compute);
  ops::copy_to_host(&norm, st.norm, sizeof(double));
  return norm;
}

bool tied_copies_equal(ParamStore& st) {
  bool equal = true;
  ops::stream_sync(st.compute);
  for (size_t u = 0; u < st.units.size(); u++) {
    const UnitState& us = st.units[u];
    if (!us.tied || st.embed->size < 2) continue;
    const FlatRange shard{us.shard_offset, us.shard_offset + us.shard_numel};
    equal = master_copies_equal(st, (int)u, *st.embed, shard) && equal;
  }
  return all_agree(*st.world, equal);
}

// ---------------------------------------------------------------------------------------------
// The optimizer's view of a shard
// ---------------------------------------------------------------------------------------------
ShardForUpdate update_begin(ParamStore& st, int unit) {
  if (store_offloaded(st)) return offload_update_begin(st, unit);
  UnitState& us = st.units[unit];
  ShardForUpdate s;
  s.master = us.master, s.m = us.adam_m, s.v = us.adam_v, s.grad = us.grad;
  s.writes_copy = st.dt != DType::F32;  // in fp32 the master is the working copy
  s.copy = us.param_shard;
  s.offset = us.shard_offset;
  return s;
}

void shard_adamw(ParamStore& st, const ShardForUpdate& s, size_t first, size_t end,
                 const AdamWStep& step) {
  if (first >= end) return;
  const size_t i = first - s.offset;
  void* copy = s.writes_copy ? (char*)s.copy + i * dtype_size(st.dt) : nullptr;
  if (!s.on_host)
    ops::adamw_update(s.master + i, copy, s.grad + i, s.m + i, s.v + i, end - first, step, st.dt,
                      st.compute);
  else if (!st.count_only) {  // the planner's host buffers are counted, not allocated
    AdamWStep on_host = step;  // the factor as offload_update_begin copied it down
    if (step.device_grad_scale) on_host.grad_scale = *st.offload.clip_factor;
    on_host.device_grad_scale = nullptr;
    host_adamw_update(s.master + i, copy, s.grad + i, s.m + i, s.v + i, end - first, on_host,
                      st.dt);
  }
}

void update_end(ParamStore& st, int unit) {
  if (store_offloaded(st)) offload_update_end(st, unit);
}

void updates_done(ParamStore& st) {
  if (store_offloaded(st)) offload_updates_done(st);
  if (gathers_weights(st)) zero_gather_weights(st);
}

void comm_after_compute(ParamStore& st) {
  ops::event_record(st.issue_point, st.compute);
  ops::stream_wait_event(st.comm, st.issue_point);
}
