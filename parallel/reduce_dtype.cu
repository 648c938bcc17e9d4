// parallel/reduce_dtype.cu - the dtype the data-parallel gradient reductions travel and sum in
// ([parallel] reduce_dtype = "fp32" | "bf16"): Megatron's grad_reduce_in_bf16, torchtitan's
// mixed-precision reduce_dtype.
//
// The idea. The gradient buckets are fp32 (the backward accumulates in fp32 and the optimizer
// reads fp32), and by default they are summed over the unit's group in fp32. In bf16 the bucket
// is rounded to bf16 (nearest even) before the collective, every addition of the reduction is
// rounded to bf16 (parallel/comm_mpi.cu's bf16 sum: fp32 add, round; NCCL's bf16 sum does the
// same per addition), and the sum comes back as fp32:
//
//   g_r (fp32) -> bf16(g_r) -> sum over the group, each partial sum rounded to bf16 -> fp32
//
// so the payload halves (2 bytes per gradient instead of 4) at the price of about 8 bits of
// mantissa on each rank's gradient and on each partial sum: a relative error of ~2^-9 per
// addition, growing with the group size. What that costs a training run is measured, not
// assumed: docs/PERF.md has the losses of 200 steps in fp32 and in bf16.
//
// Who talks to whom: the same groups and collectives as in fp32 (DDP's all-reduce, ZeRO's
// reduce-scatters, HSDP's replica all-reduce of the shard, parallel/hsdp.cu), with bf16 payloads:
// half the bytes on every one of them. Not changed: the tp sum of partial gradients and the tied
// embedding's sum over the pipeline's two ends (fp32, small), compressed reductions
// (grad_compression has its own codes; refused together).
//
// Memory: one bf16 scratch buffer on the device of (largest padded unit + largest shard)
// elements (with [parallel] bucket_mb: of the largest bucket, parallel/grad_buckets.cu), in the
// store's working memory (the planner counts it).
//
//   comm stream   |cast bf16|all-reduce / reduce-scatter (bf16)|cast fp32|   per bucket
#include "parallel/param_store.h"

#include <algorithm>

DType reduce_dtype(const std::string& s) {
  if (s == "fp32" || s.empty()) return DType::F32;
  if (s == "bf16") return DType::BF16;
  BUG("[parallel] reduce_dtype = \"%s\"", s.c_str());
}

// The bf16 scratch: a whole padded unit or bucket (the input) and a shard (a reduce-scatter's
// output).
void reduce_dtype_init(ParamStore& st) {
  if (st.reduce_dt == DType::F32) return;
  size_t unit = 0, shard = 0;
  for (const UnitState& us : st.units) {
    unit = std::max({unit, us.padded_numel, us.numel});
    shard = std::max(shard, us.shard_numel);
  }
  for (const GradBucket& b : st.buckets) {  // [parallel] bucket_mb (parallel/grad_buckets.cu)
    const int ranks = st.mode == ShardingMode::Replicated ? 1 : st.units[b.units[0]].group->size;
    unit = std::max(unit, b.part * ranks);
    shard = std::max(shard, b.part);
  }
  st.reduce_scratch_bf16 = allocate(st.work_memory, (unit + shard) * dtype_size(st.reduce_dt));
}

void grad_sum(ParamStore& st, Comm& group, float* buf, size_t n) {
  if (st.reduce_dt == DType::F32) return all_reduce_sum(group, buf, n, DType::F32, st.comm);
  void* low = st.reduce_scratch_bf16;
  ops::cast(low, st.reduce_dt, buf, DType::F32, n, st.comm);
  all_reduce_sum(group, low, n, st.reduce_dt, st.comm);
  ops::cast(buf, DType::F32, low, st.reduce_dt, n, st.comm);
}

void grad_sum_scatter(ParamStore& st, Comm& group, const float* full, float* shard,
                      size_t shard_n) {
  if (st.reduce_dt == DType::F32)
    return reduce_scatter_sum(group, full, shard, shard_n, DType::F32, st.comm);
  const size_t n = (size_t)group.size * shard_n, elem = dtype_size(st.reduce_dt);
  char* low = (char*)st.reduce_scratch_bf16;
  ops::cast(low, st.reduce_dt, full, DType::F32, n, st.comm);
  reduce_scatter_sum(group, low, low + n * elem, shard_n, st.reduce_dt, st.comm);
  ops::cast(shard, DType::F32, low + n * elem, st.reduce_dt, shard_n, st.comm);
}
