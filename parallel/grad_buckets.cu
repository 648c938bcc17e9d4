// parallel/grad_buckets.cu - gradient buckets of several units ([parallel] bucket_mb): fewer,
// larger data-parallel reductions (PyTorch DDP's bucket_cap_mb, Megatron's bucket_size).
//
// The idea. By default every unit (a transformer block, an expert set, the root) is its own
// bucket: its gradient is all-reduced (DDP, parallel/ddp.cu) or reduce-scattered (ZeRO-1/2/FSDP,
// parallel/zero.cu, sharded_grads.cu) the moment its backward is queued. A collective costs a
// latency (a few microseconds per ring step on NVLink, tens across nodes) besides its bytes, so
// many small units waste the links; bucket_mb = B groups consecutive units while their fp32
// gradients fit in B MiB, and the group travels as one message when its last unit is released.
// The arithmetic is unchanged: each element is still the sum over the group's ranks of the same
// fp32 values (reduce_dtype's rounding included), so the gradients are bitwise those of one
// bucket per unit wherever the collective sums an element in the same order (always over two
// ranks; over more, MPI and NCCL may pick another order for another message size).
//
// Layout. A rank's part of a bucket is its shard of each unit, one after the other (DDP: the
// whole units). A reduce-scatter hands rank r the r-th part, so the staging buffer holds every
// rank's part, rank by rank - unit u's shard r goes to part r:
//
//   units      u1 = [s0 | s1]       u2 = [t0 | t1]          (group of 2 ranks, shards s, t)
//   staging    [s0 t0 | s1 t1]      reduce-scatter -> rank 0: [s0+s0' t0+t0'], rank 1: [s1.. t1..]
//
// and the sum of each unit's shard is copied (ZeRO-1) or added (ZeRO-2, FSDP: the micro-steps
// accumulate on shards) back where the optimizer reads it. DDP all-reduces the concatenation
// and copies each unit's sum back into its gradient.
//
//   compute  |bwd L|bwd L-1|bwd L-2|bwd L-3| ... |bwd 0|emb|
//   comm           |copy L |copy L-1      |RS/AR bucket {L, L-1}| ... (one message per bucket)
//
// Who talks to whom: the unit's group (dp, dp x cp, the expert ranks; HSDP's shard group), as
// before. Bytes: the same payload, in fewer messages: for units of n_i elements, one collective
// of sum n_i x 4 bytes (2 in bf16) instead of one per unit; a ring puts the same (G-1)/G share on
// the wire. Device memory: one fp32 staging buffer of the largest bucket (all ranks' parts) and,
// ZeRO, one of a rank's part; the planner counts both. The copies run on the comm stream.
//
// Which units share a bucket: consecutive units with one group and one HSDP replica group, of
// one pipeline stage (chunks release in any order), none acquired for the whole step (the root:
// reduced once per step, at its end) and no experts next to their block (their releases
// interleave with the blocks'), whose fp32 gradients fit together in bucket_mb MiB. A unit larger
// than that goes alone. Releases of a bucket's units then come back to back (descending unit
// order, lone units between them), so one staging buffer serves every bucket in turn.
// Compressed reductions keep an error-feedback residual per unit: refused together.
#include "parallel/param_store.h"

#include <algorithm>
#include <climits>

namespace {

bool sharded(const ParamStore& st) { return st.mode != ShardingMode::Replicated; }

// The bytes a unit's fp32 gradient bucket holds (padding included).
size_t grad_bytes(const UnitState& us) { return us.padded_numel * sizeof(float); }

// Unit u holds an MoE block's experts: the unit before it is their block (ParamUnit::paired).
bool experts(const std::vector<ParamUnit>& units, int u) { return u > 0 && units[u - 1].paired; }

// Whether unit u may join the bucket that ends with unit u - 1.
bool may_join(const ParamStore& st, const std::vector<ParamUnit>& units, int u, size_t bytes) {
  const UnitState &a = st.units[u - 1], &b = st.units[u];
  const double cap = st.bucket_mb * 1024.0 * 1024.0;
  return !a.whole_step && !b.whole_step && a.group == b.group && a.replica == b.replica &&
         units[u - 1].stage == units[u].stage && !experts(units, u) && !experts(units, u - 1) &&
         (double)(bytes + grad_bytes(b)) <= cap;
}

// A rank's part of bucket b: each unit's shard (DDP: the whole unit), one after the other.
void lay_out(const ParamStore& st, GradBucket& b) {
  for (int u : b.units) {
    b.offset.push_back(b.part);
    b.part += sharded(st) ? st.units[u].shard_numel : st.units[u].numel;
  }
}

bool in_open_bucket(const ParamStore& st) {
  for (const GradBucket& b : st.buckets)
    if (b.released > 0) return true;
  return false;
}

// Unit u's local gradient into its place in the staging buffer, on the comm stream.
void stage_unit(ParamStore& st, const GradBucket& b, size_t i) {
  UnitState& us = st.units[b.units[i]];
  float* dst = st.bucket_staging + b.offset[i];
  if (!sharded(st))
    return ops::copy_on_device(dst, us.grad, us.numel * sizeof(float), st.comm);
  // shard r of the unit into rank r's part: rows of shard_numel, strided by the part
  CHECK(b.part <= INT_MAX, "gradient bucket of %zu elements per rank: at most 2^31 - 1",
        b.part);
  ops::copy_columns(dst, (int)b.part, DType::F32, us.grad_full, (int)us.shard_numel, DType::F32,
                    us.group->size, (int)us.shard_numel, st.comm);
}

// ZeRO-2 and FSDP: the unit's pooled bucket is free once the copy out of it is done.
void give_back_slot(ParamStore& st, int unit) {
  UnitState& us = st.units[unit];
  if (st.mode != ShardingMode::ZeRO2 && st.mode != ShardingMode::FSDP) return;
  ops::event_record(st.grad_slot_reduced[st.grad_pool.slot_of[unit]], st.comm);
  pool_give_back(st.grad_pool, unit);
  us.grad_full = nullptr;
}

// The whole bucket over the group: one all-reduce (DDP) or reduce-scatter (ZeRO), then each
// unit's sum where the optimizer reads it.
void send_bucket(ParamStore& st, const GradBucket& b) {
  Comm& group = *st.units[b.units[0]].group;
  if (!sharded(st)) grad_sum(st, group, st.bucket_staging, b.part);
  else grad_sum_scatter(st, group, st.bucket_staging, st.bucket_scratch, b.part);
  for (size_t i = 0; i < b.units.size(); i++) {
    UnitState& us = st.units[b.units[i]];
    if (!sharded(st))
      ops::copy_on_device(us.grad, st.bucket_staging + b.offset[i], us.numel * sizeof(float),
                          st.comm);
    else if (st.mode == ShardingMode::ZeRO1)
      ops::copy_on_device(us.grad, st.bucket_scratch + b.offset[i],
                          us.shard_numel * sizeof(float), st.comm);
    else ops::add_inplace(us.grad, st.bucket_scratch + b.offset[i], us.shard_numel, st.comm);
  }
}

}  // namespace

void grad_buckets_init(ParamStore& st, const std::vector<ParamUnit>& units) {
  st.bucket_of.assign(st.units.size(), -1);
  if (st.bucket_mb <= 0 || store_compressed(st)) return;
  std::vector<std::vector<int>> groups;
  size_t bytes = 0;
  for (int u = 0; u < (int)st.units.size(); u++) {
    if (u > 0 && may_join(st, units, u, bytes)) {
      groups.back().push_back(u);
      bytes += grad_bytes(st.units[u]);
      continue;
    }
    groups.push_back({u});
    bytes = grad_bytes(st.units[u]);
  }
  size_t staging = 0, part = 0;
  for (const std::vector<int>& g : groups) {
    if (g.size() < 2) continue;  // a bucket of one unit goes out as by default
    GradBucket b;
    b.units = g;
    lay_out(st, b);
    for (int u : g) st.bucket_of[u] = (int)st.buckets.size();
    staging = std::max(staging, b.part * (sharded(st) ? st.units[g[0]].group->size : 1));
    part = std::max(part, b.part);
    st.buckets.push_back(b);
  }
  if (st.buckets.empty()) return;
  st.bucket_staging = (float*)allocate(st.work_memory, staging * sizeof(float));
  if (sharded(st)) st.bucket_scratch = (float*)allocate(st.work_memory, part * sizeof(float));
}

bool in_grad_bucket(const ParamStore& st, int unit) {
  return !st.bucket_of.empty() && st.bucket_of[unit] >= 0;
}

// DDP and ZeRO-1 reduce once per step, after the last micro-step; ZeRO-2 and FSDP every
// micro-step. The unit goes into the staging buffer; its bucket's last unit sends the bucket.
void grad_bucket_release(ParamStore& st, int unit, bool last_micro_step) {
  const bool every_micro_step = st.mode == ShardingMode::ZeRO2 || st.mode == ShardingMode::FSDP;
  if (!every_micro_step && !last_micro_step) return;
  GradBucket& b = st.buckets[st.bucket_of[unit]];
  CHECK(b.released > 0 || !in_open_bucket(st),
        "gradient buckets: unit %d released while another bucket is half full (releases must "
        "come bucket by bucket)", unit);
  const size_t i = (size_t)(std::find(b.units.begin(), b.units.end(), unit) - b.units.begin());
  comm_after_compute(st);  // the unit's backward is queued on the compute stream
  stage_unit(st, b, i);
  give_back_slot(st, unit);
  if (++b.released < (int)b.units.size()) return;
  b.released = 0;
  send_bucket(st, b);
  if (last_micro_step)
    for (int u : b.units) unit_grads_reduced(st, u);
}
