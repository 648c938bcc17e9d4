// parallel/param_store.cu - the parts of the ParamStore that do not depend on how weights are
// distributed: shard geometry, filling shards from a ParamFill, zeroing gradients, the global
// gradient norm, and the dispatch to DDP (parallel/ddp.cu) or FSDP (parallel/fsdp.cu).
//
// Shard geometry. A unit of `numel` elements is padded to padded_numel, a multiple of
// dp * kTensorAlign, and rank r owns [r * padded/dp, (r+1) * padded/dp). The padding is zero in
// the weights, the gradients and both moments, and AdamW keeps it zero (g = 0 -> no update), so
// it never shows in a norm or a checkpoint. Replicated mode is the same with one shard.
#include "parallel/param_store.h"

#include <algorithm>
#include <cmath>

static float* alloc_zeroed_f32(size_t n, ops::Stream s) {
  float* p = (float*)ops::alloc(n * sizeof(float));
  ops::fill_zero(p, n * sizeof(float), s);
  return p;
}

// Writes this rank's shard of unit `u` (host memory, shard_numel floats) from `fill`.
static void fill_shard(const ParamUnit& pu, const UnitState& us, const ParamFill& fill,
                       float* host) {
  std::fill(host, host + us.shard_numel, 0.0f);
  const size_t lo = us.shard_offset, hi = us.shard_offset + us.shard_numel;
  for (const ParamTensor& t : pu.tensors) {
    const size_t a = std::max(lo, t.offset), b = std::min(hi, t.offset + t.numel());
    if (a < b) fill(t, a - t.offset, b - a, host + (a - lo));
  }
}

const char* state_kind_name(StateKind k) {
  return k == StateKind::Master ? "model" : k == StateKind::AdamM ? "optim/m" : "optim/v";
}

float* store_state(ParamStore& st, int unit, StateKind k) {
  UnitState& us = st.units[unit];
  return k == StateKind::Master ? us.master : k == StateKind::AdamM ? us.adam_m : us.adam_v;
}

void param_store_load(ParamStore& st, const GPTLayout& layout, const ParamFill& fill,
                      StateKind kind) {
  std::vector<float> host;
  for (size_t u = 0; u < st.units.size(); u++) {
    UnitState& us = st.units[u];
    host.resize(us.shard_numel);
    fill_shard(layout.units[u], us, fill, host.data());
    ops::copy_to_device(store_state(st, (int)u, kind), host.data(),
                        us.shard_numel * sizeof(float));
    if (kind == StateKind::Master && store_needs_param_copy(st))
      ops::cast(store_param_copy(st, (int)u), st.dt, us.master, DType::F32, us.shard_numel,
                st.compute);
  }
  ops::stream_sync(st.compute);
}

void param_store_init(ParamStore& st, const GPTLayout& layout, ShardingMode mode, DType dt,
                      Comm* dp, ops::Stream compute, ops::Stream comm, const ParamFill& fill) {
  st.mode = mode;
  st.dt = dt;
  st.dp = dp;
  st.compute = compute;
  st.comm = comm;
  const bool sharded = mode == ShardingMode::FSDP;
  const size_t ranks = sharded ? (size_t)dp->size : 1;
  for (const ParamUnit& pu : layout.units) {
    UnitState us;
    us.numel = pu.numel;
    us.padded_numel = sharded ? round_up(pu.numel, ranks * kTensorAlign) : pu.numel;
    us.shard_numel = us.padded_numel / ranks;
    us.shard_offset = sharded ? (size_t)dp->rank * us.shard_numel : 0;
    us.master = alloc_zeroed_f32(us.shard_numel, compute);
    us.adam_m = alloc_zeroed_f32(us.shard_numel, compute);
    us.adam_v = alloc_zeroed_f32(us.shard_numel, compute);
    us.grad = alloc_zeroed_f32(us.shard_numel, compute);
    st.state_bytes += 4 * us.shard_numel * sizeof(float);
    st.units.push_back(us);
  }
  st.norm_scratch = alloc_zeroed_f32(1, compute);
  st.comm_idle = ops::event_create();
  if (sharded) fsdp_init(st);
  else ddp_init(st);
  param_store_load(st, layout, fill);
}

void param_store_destroy(ParamStore& st) {
  ops::stream_sync(st.compute);
  ops::stream_sync(st.comm);
  if (st.mode == ShardingMode::FSDP) fsdp_destroy(st);
  else ddp_destroy(st);
  for (UnitState& us : st.units) {
    ops::release(us.master);
    ops::release(us.adam_m);
    ops::release(us.adam_v);
    ops::release(us.grad);
  }
  ops::release(st.norm_scratch);
  ops::event_destroy(st.comm_idle);
  st.units.clear();
}

// ---------------------------------------------------------------------------------------------
// Dispatch
// ---------------------------------------------------------------------------------------------
void* params_acquire(ParamStore& st, int unit, Phase phase) {
  return st.mode == ShardingMode::FSDP ? fsdp_params_acquire(st, unit, phase)
                                       : ddp_params_acquire(st, unit);
}
void params_release(ParamStore& st, int unit, Phase phase) {
  if (st.mode == ShardingMode::FSDP) fsdp_params_release(st, unit, phase);
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

void grads_wait(ParamStore& st) {
  ops::event_record(st.comm_idle, st.comm);
  ops::stream_wait_event(st.compute, st.comm_idle);
}

double grad_norm(ParamStore& st) {
  ops::fill_zero(st.norm_scratch, sizeof(float), st.compute);
  for (UnitState& us : st.units)
    ops::sum_squares_accumulate(st.norm_scratch, us.grad, us.shard_numel, st.compute);
  float local = 0;
  ops::stream_sync(st.compute);
  ops::copy_to_host(&local, st.norm_scratch, sizeof(float));
  double total = local;
  if (st.mode == ShardingMode::FSDP) total = all_reduce_host_sum(*st.dp, total);
  return std::sqrt(total);
}

bool store_needs_param_copy(const ParamStore& st) { return st.dt != DType::F32; }

void* store_param_copy(ParamStore& st, int unit) {
  UnitState& us = st.units[unit];
  return st.mode == ShardingMode::FSDP ? us.param_shard : us.params;
}
