// parallel/ddp.cu - distributed data parallel: every rank a full replica, gradients averaged.
//
// The idea. Each of the dp ranks runs the same model on a different slice of the global batch,
// so each holds the gradient of its own slice. The gradient of the global batch is their sum
// (the loss is scaled by 1/(global batch) before the backward, so a sum is the mean):
//
//     g = sum_r g_r          one all-reduce over the dp group, per step
//
// after which every rank applies the same AdamW update to the same weights, and the replicas
// stay identical without ever exchanging weights.
//
// Who talks to whom: all dp ranks, in a ring (NCCL) or whatever MPI picks. Bytes per step: one
// all-reduce of the fp32 gradients, 4*N bytes of payload, of which a ring puts 2(dp-1)/dp on the
// wire per rank.
//
// Overlap. The gradients are reduced in buckets - one per unit (a transformer block, or the
// root: embeddings + final LayerNorm) - and a bucket is launched on the comm stream the moment
// the backward of its unit is done, so the all-reduce of block l runs while blocks l-1 ... 0
// compute their backward. With gradient accumulation only the last micro-step reduces; the
// earlier ones accumulate locally (PyTorch's no_sync). [parallel] bucket_mb groups consecutive
// units into one bucket, one all-reduce of their concatenated gradients when the last of them is
// released (parallel/grad_buckets.cu): fewer calls, the same bytes.
//
//   compute  |bwd L|bwd L-1|bwd L-2| ... |bwd 0|emb|        |optimizer
//   comm           |AR L   |AR L-1 | ...       |AR 0|AR root|
#include "parallel/param_store.h"

// Every unit whole: the working copy (in fp32 also the master, parallel/param_store.cu) and the
// gradient.
void ddp_init(ParamStore& st) {
  for (UnitState& us : st.units) {
    us.params = allocate_zeroed(st.state_memory, us.numel * dtype_size(st.dt), st.compute);
    us.param_shard = us.params;
    us.grad = (float*)allocate_zeroed(st.state_memory, us.numel * sizeof(float), st.compute);
    us.grad_full = us.grad;
    us.reduce_done = allocate_event(st.work_memory);
  }
}

void* ddp_params_acquire(ParamStore& st, int unit) { return st.units[unit].params; }

// The whole unit's gradient, where the micro-steps accumulate (ZeRO-1's too).
float* ddp_grads_acquire(ParamStore& st, int unit) { return st.units[unit].grad_full; }

// After the last micro-step the bucket is complete on the compute stream; the comm stream sums
// it over the group in place (the store's BucketReduction: one all-reduce, or its compressed
// variant, parallel/grad_compression.cu).
void ddp_grads_release(ParamStore& st, int unit, bool last_micro_step) {
  if (!last_micro_step) return;
  UnitState& us = st.units[unit];
  ops::event_record(us.reduce_done, st.compute);
  ops::stream_wait_event(st.comm, us.reduce_done);
  reduce_bucket(st, unit, us.grad);
}
