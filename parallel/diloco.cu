// parallel/diloco.cu - DiLoCo's outer step (the algorithm, who talks to whom and its bytes:
// parallel/diloco.h).
#include "parallel/diloco.h"

#include <algorithm>
#include <cstring>

#include "kernels/host_diloco.h"

bool diloco_enabled(const Config& cfg) { return cfg.parallel.diloco_islands >= 1; }

CommsByAxis diloco_store_comms(Mesh& mesh, const Config& cfg) {
  CommsByAxis comms = mesh_comms(mesh);
  if (diloco_enabled(cfg)) comms.axis[(int)Axis::World] = &mesh[Axis::IslandWorld];
  return comms;
}

// int8 meetings: the compressor's scratch for the largest shard over K ranks (work memory) and a
// zero residual per unit (state memory), both counted by the planner.
static void outer_compression_init(Diloco& d, ParamStore& st) {
  if (d.compressor.kind == GradCompression::None || d.island->size < 2) return;
  const int k = d.island->size;
  OuterState& o = st.outer;
  for (UnitState& us : st.units) {
    grad_compressor_need(d.compressor, us.shard_numel, k);
    o.residual_numel.push_back(residual_numel(GradCompression::Int8, us.shard_numel, k));
    o.residual.push_back((float*)allocate_zeroed(
        st.state_memory, o.residual_numel.back() * sizeof(float), st.compute));
  }
  grad_compressor_allocate(d.compressor, st.work_memory);
}

// Optimizer offload: the outer state lives with the master, in pinned host memory (the offload's
// HostAllocator, counted by the planner; nvme too: 8 bytes per weight of the shard in host memory
// next to the file), w_sync = the master as the store holds it, and the delta has a host buffer.
static void host_outer_init(Diloco& d, ParamStore& st, size_t largest) {
  HostAllocator& h = st.offload.memory;
  OuterState& o = st.outer;
  for (UnitState& us : st.units) {
    const size_t bytes = us.shard_numel * sizeof(float);
    o.sync.push_back((float*)allocate_host(h, bytes));
    o.momentum.push_back((float*)allocate_host(h, bytes));
  }
  for (size_t u = 0; u < st.units.size() && !st.count_only; u++) {
    const UnitState& us = st.units[u];
    store_state_read(st, (int)u, StateKind::Master, us.shard_offset, us.shard_numel, o.sync[u]);
    std::memset(o.momentum[u], 0, us.shard_numel * sizeof(float));
  }
  d.host_delta = (float*)allocate_host(h, largest * sizeof(float));
}

void diloco_init(Diloco& d, const Config& cfg, ParamStore& st, Comm& island) {
  const ParallelConfig& p = cfg.parallel;
  d.islands = p.diloco_islands, d.every = p.diloco_every;
  d.outer_lr = (float)p.diloco_outer_lr, d.momentum = (float)p.diloco_outer_momentum;
  d.island = &island;
  d.compressor.kind = grad_compression_kind(p.diloco_compression);
  size_t largest = 0;
  for (const UnitState& us : st.units) largest = std::max(largest, us.shard_numel);
  d.delta = (float*)allocate(st.work_memory, largest * sizeof(float));
  outer_compression_init(d, st);
  if (store_offloaded(st)) return host_outer_init(d, st, largest);
  for (UnitState& us : st.units) {
    const size_t bytes = us.shard_numel * sizeof(float);
    st.outer.sync.push_back((float*)allocate(st.state_memory, bytes));
    st.outer.momentum.push_back((float*)allocate_zeroed(st.state_memory, bytes, st.compute));
    ops::copy_on_device(st.outer.sync.back(), us.master, bytes, st.compute);  // dry in the planner
  }
  ops::stream_sync(st.compute);
}

size_t diloco_outer_bytes(const Diloco& d, const ParamStore& st) {
  size_t bytes = 0;
  for (const UnitState& us : st.units)
    bytes += d.compressor.kind == GradCompression::None ? 4 * us.shard_numel
             : d.island->size < 2 ? 0
             : compressed_payload_bytes(d.compressor.kind, 0, us.shard_numel, d.island->size, true);
  return bytes;
}

// int8 meetings under tp: the delta of a weight replicated over tp is the same on every tp rank,
// but its int8 block scale depends on the tp-specific (split) deltas beside it, so each tp rank
// would receive a different approximation and the replicas would drift apart. In a unit that
// holds both, tp rank 0 alone sends the replicated part and the tp ranks then sum it (the others
// sent zeros): every one gets rank 0's (parallel/grad_compression.cu, "The other axes"). The
// shard-relative range of that part; empty when there is nothing to mix.
static FlatRange owner_only_delta(const ParamStore& st, const UnitState& us) {
  if (st.tp->size < 2 || us.replicated_begin == 0 || us.replicated_begin >= us.numel) return {};
  const FlatRange shard{us.shard_offset, us.shard_offset + us.shard_numel};
  const size_t first = std::max(shard.first, us.replicated_begin);
  const size_t end = std::min(shard.end, us.numel);
  if (first >= end) return {};
  return {first - shard.first, end - shard.first};
}

// The delta (n floats in d.delta on the device) summed over the islands in place: fp32, or int8
// with this rank's residual (parallel/grad_compression.cu; nothing to do on one island).
static void island_sum(Diloco& d, const ParamStore& st, int u, size_t n, ops::Stream s) {
  if (d.compressor.kind == GradCompression::None) {
    all_reduce_sum(*d.island, d.delta, n, DType::F32, s);
    return;
  }
  const FlatRange mine = owner_only_delta(st, st.units[u]);
  if (mine.size() && st.tp->rank != 0)
    ops::fill_zero(d.delta + mine.first, mine.size() * sizeof(float), s);
  compressed_all_reduce(d.compressor, *d.island, d.delta, st.outer.residual[u], n, s);
  if (mine.size()) all_reduce_sum(*st.tp, d.delta + mine.first, mine.size(), DType::F32, s);
}

// Optimizer offload: the same step on the host, where the master and the outer state live; only
// the delta goes down to the device for the all-reduce and back. The new weights go into the
// staging copy that update_end sends up (and, nvme, the master back to its file).
static void host_outer_step(Diloco& d, ParamStore& st, int u, const ShardForUpdate& s) {
  const size_t n = st.units[u].shard_numel;
  float *sync = st.outer.sync[u], *m = st.outer.momentum[u];
  if (!st.count_only) {  // the planner counts the all-reduce; the host buffers are not there
    host_diloco_outer_delta(d.host_delta, sync, s.master, n);
    ops::copy_to_device(d.delta, d.host_delta, n * sizeof(float));
  }
  island_sum(d, st, u, n, st.compute);
  if (st.count_only) return;
  ops::stream_sync(st.compute);
  ops::copy_to_host(d.host_delta, d.delta, n * sizeof(float));
  host_diloco_outer_step(sync, m, s.master, d.host_delta, n,
                         1.0f / (float)d.islands, d.outer_lr, d.momentum, s.copy, st.dt);
}

// One unit's shard: the delta, averaged over the islands (summed in place, int8: compressed with
// this rank's residual; scaled in the step), the Nesterov step into w_sync and the master, and
// the master into the working copy, as AdamW leaves it (parallel/param_store.h, update_begin).
static void outer_step_unit(Diloco& d, ParamStore& st, int u) {
  const size_t n = st.units[u].shard_numel;
  const ShardForUpdate s = update_begin(st, u);
  if (s.on_host) {
    host_outer_step(d, st, u, s);
  } else {
    float *sync = st.outer.sync[u], *m = st.outer.momentum[u];
    ops::diloco_outer_delta(d.delta, sync, s.master, n, st.compute);
    island_sum(d, st, u, n, st.compute);
    ops::diloco_outer_step(sync, m, s.master, d.delta, n,
                           1.0f / (float)d.islands, d.outer_lr, d.momentum, st.compute);
    if (s.writes_copy) ops::cast(s.copy, st.dt, s.master, DType::F32, n, st.compute);
  }
  update_end(st, u);
}

void diloco_after_step(Diloco& d, ParamStore& st, int step) {
  if (d.islands < 1 || step % d.every != 0) return;
  ops::stream_sync(st.comm);  // ZeRO-1/2: the optimizer's all-gather still reads the shards
  for (size_t u = 0; u < st.units.size(); u++) outer_step_unit(d, st, (int)u);
  updates_done(st);  // ZeRO-1/2: the new weights gathered inside the island
}
