// parallel/diloco.cu - DiLoCo's outer step (the algorithm, who talks to whom and its bytes:
// parallel/diloco.h).
#include "parallel/diloco.h"

#include <algorithm>

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
  for (UnitState& us : st.units) {
    grad_compressor_need(d.compressor, us.shard_numel, k);
    us.outer_residual_numel = residual_numel(GradCompression::Int8, us.shard_numel, k);
    us.outer_residual = (float*)allocate_zeroed(
        st.state_memory, us.outer_residual_numel * sizeof(float), st.compute);
  }
  grad_compressor_allocate(d.compressor, st.work_memory);
}

void diloco_init(Diloco& d, const Config& cfg, ParamStore& st, Comm& island) {
  const ParallelConfig& p = cfg.parallel;
  CHECK(!store_offloaded(st), "diloco: no optimizer offload (the outer step runs on the device)");
  d.islands = p.diloco_islands, d.every = p.diloco_every;
  d.outer_lr = (float)p.diloco_outer_lr, d.momentum = (float)p.diloco_outer_momentum;
  d.island = &island;
  d.compressor.kind = grad_compression_kind(p.diloco_compression);
  size_t largest = 0;
  for (UnitState& us : st.units) {
    const size_t bytes = us.shard_numel * sizeof(float);
    largest = std::max(largest, us.shard_numel);
    us.outer_sync = (float*)allocate(st.state_memory, bytes);
    us.outer_m = (float*)allocate_zeroed(st.state_memory, bytes, st.compute);
    ops::copy_on_device(us.outer_sync, us.master, bytes, st.compute);  // dry in the planner
  }
  d.delta = (float*)allocate(st.work_memory, largest * sizeof(float));
  outer_compression_init(d, st);
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

// One unit's shard: the delta, averaged over the islands (summed in place, int8: compressed with
// this rank's residual; scaled in the step),
// the Nesterov step into w_sync and the master, and the master into the working copy, as AdamW
// leaves it (parallel/param_store.h, update_begin).
static void outer_step_unit(Diloco& d, ParamStore& st, int u) {
  UnitState& us = st.units[u];
  const size_t n = us.shard_numel;
  const ShardForUpdate s = update_begin(st, u);
  ops::diloco_outer_delta(d.delta, us.outer_sync, s.master, n, st.compute);
  if (d.compressor.kind == GradCompression::None)
    all_reduce_sum(*d.island, d.delta, n, DType::F32, st.compute);
  else  // parallel/grad_compression.cu; nothing to do on one island
    compressed_all_reduce(d.compressor, *d.island, d.delta, us.outer_residual, n, st.compute);
  ops::diloco_outer_step(us.outer_sync, us.outer_m, s.master, d.delta, n,
                         1.0f / (float)d.islands, d.outer_lr, d.momentum, st.compute);
  if (s.writes_copy) ops::cast(s.copy, st.dt, s.master, DType::F32, n, st.compute);
  update_end(st, u);
}

void diloco_after_step(Diloco& d, ParamStore& st, int step) {
  if (d.islands < 1 || step % d.every != 0) return;
  ops::stream_sync(st.comm);  // ZeRO-1/2: the optimizer's all-gather still reads the shards
  for (size_t u = 0; u < st.units.size(); u++) outer_step_unit(d, st, (int)u);
  updates_done(st);  // ZeRO-1/2: the new weights gathered inside the island
}
