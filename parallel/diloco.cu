// parallel/diloco.cu - DiLoCo's outer step (the algorithm and its bytes: parallel/diloco.h).
#include "parallel/diloco.h"

bool diloco_enabled(const Config& cfg) { return cfg.parallel.diloco_islands >= 1; }

void diloco_init(Diloco& d, const Config& cfg, ParamStore& st, Comm& island) {
  const ParallelConfig& p = cfg.parallel;
  CHECK(st.mode == ShardingMode::Replicated, "diloco: DDP (zero = 0) only");
  d.islands = p.diloco_islands, d.every = p.diloco_every;
  d.outer_lr = (float)p.diloco_outer_lr, d.momentum = (float)p.diloco_outer_momentum;
  d.island = &island;
  size_t largest = 0;
  for (const UnitState& us : st.units) largest = std::max(largest, us.numel);
  d.delta = (float*)allocate(st.work_memory, largest * sizeof(float));
  if (st.count_only) return;  // the planner: the device buffer counted, no host state
  d.w_sync.resize(st.units.size());
  d.outer_m.resize(st.units.size());
  for (size_t u = 0; u < st.units.size(); u++) {
    const size_t n = st.units[u].numel;
    d.w_sync[u].assign(n, 0.0f);
    d.outer_m[u].assign(n, 0.0f);
    store_state_read(st, (int)u, StateKind::Master, 0, n, d.w_sync[u].data());
  }
}

// One unit: delta to the device, averaged over the islands, back; the Nesterov step; the new
// weights into the master and the working copy.
static void outer_step_unit(Diloco& d, ParamStore& st, int u) {
  UnitState& us = st.units[u];
  const size_t n = us.numel;
  std::vector<float> w(n), delta(n);
  store_state_read(st, u, StateKind::Master, 0, n, w.data());
  std::vector<float>& ws = d.w_sync[u];
  std::vector<float>& m = d.outer_m[u];
  for (size_t i = 0; i < n; i++) delta[i] = ws[i] - w[i];
  ops::copy_to_device(d.delta, delta.data(), n * sizeof(float));
  all_reduce_sum(*d.island, d.delta, n, DType::F32, st.compute);
  ops::stream_sync(st.compute);
  ops::copy_to_host(delta.data(), d.delta, n * sizeof(float));
  const float inv_k = 1.0f / (float)d.islands, mu = d.momentum, lr = d.outer_lr;
  for (size_t i = 0; i < n; i++) {
    const float g = delta[i] * inv_k;
    m[i] = mu * m[i] + g;
    ws[i] = ws[i] - lr * (g + mu * m[i]);
  }
  ops::copy_to_device(us.master, ws.data(), n * sizeof(float));
  if (st.dt != DType::F32) ops::cast(us.param_shard, st.dt, us.master, DType::F32, n, st.compute);
}

size_t diloco_outer_bytes(const ParamStore& st) {
  size_t n = 0;
  for (const UnitState& us : st.units) n += us.numel;
  return n * sizeof(float);
}

void diloco_after_step(Diloco& d, ParamStore& st, int step) {
  if (d.islands < 1 || step % d.every != 0 || st.count_only) return;
  ops::stream_sync(st.compute);
  ops::stream_sync(st.comm);
  for (size_t u = 0; u < st.units.size(); u++) outer_step_unit(d, st, (int)u);
  ops::stream_sync(st.compute);
}
