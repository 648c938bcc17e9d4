// parallel/zero.cu - ZeRO stages 1 and 2: the rungs between DDP (parallel/ddp.cu) and FSDP
// (parallel/fsdp.cu, ZeRO-3), and the ladder they make together.
//
// The idea. A DDP rank holds four copies of the model's worth of state, and only one of them is
// needed in full by every rank at every moment:
//
//   working weights   read by every layer of the forward and the backward      needed in full
//   gradients         written by the backward, read by the optimizer         in full per bucket
//   fp32 master, m, v read and written by the optimizer only, elementwise        1/dp suffices
//
// AdamW is elementwise, so the update of element i needs only element i of the gradient, the
// master and the moments. ZeRO (Rajbhandari et al., 2020) shards what is not needed in full:
//   ZeRO-1  the master and the moments: each rank updates its 1/dp shard of every unit, then the
//           new weights are all-gathered so that every rank has them all again.
//   ZeRO-2  the gradients too: a rank needs only the sum of its shard's gradients, so each
//           bucket is reduce-scattered as soon as its backward is done, and the full gradient
//           lives for one bucket's backward only (FSDP's gradient path: a small pool of buffers).
//   ZeRO-3  the working weights too: FSDP, weights all-gathered just in time, layer by layer.
// Every stage shards with the one geometry of parallel/placement.h (shard_range over the unit's
// gradient group, ParamUnit::grad_axis), so the optimizer, the gradient norm and the checkpoints
// see the same shards at every stage, and a checkpoint written at one stage resumes at any other.
//
// The ladder. Per rank, for Psi parameters, N ranks in the group, a compute dtype of b bytes (2
// for bf16; in fp32 b = 4 and the master is the working copy itself, saving 4 Psi/N, or 4 Psi for
// DDP), the state on the device:
//
//   stage       weights   fp32 master   Adam m, v   gradients    bf16 (b = 2)     fp32
//   0 DDP       b Psi     4 Psi         8 Psi       4 Psi        18 Psi           16 Psi
//   1 ZeRO-1    b Psi     4 Psi/N       8 Psi/N     4 Psi        6 Psi + 12 Psi/N 8 Psi + 8 Psi/N
//   2 ZeRO-2    b Psi     4 Psi/N       8 Psi/N     4 Psi/N      2 Psi + 16 Psi/N 4 Psi + 12 Psi/N
//   3 ZeRO-3    b Psi/N   4 Psi/N       8 Psi/N     4 Psi/N      18 Psi/N         16 Psi/N
//
// plus working buffers: ZeRO-2 and -3 hold two or three unit-sized gradient buffers (and the
// root's), ZeRO-3 as many gathered weight buffers. Optimizer offload (parallel/offload.cu) takes
// the master and the moments (12 Psi/N) off the device at stages 1-3.
//
// Communication per step (payload per rank, in bytes; a ring puts (N-1)/N of an all-gather's or
// reduce-scatter's payload on the wire per rank, 2(N-1)/N of an all-reduce's), m micro-batches:
//
//   stage       gradients                         weights                    wire, m = 1
//   0 DDP       all-reduce 4 Psi once             -                          8 Psi (N-1)/N
//   1 ZeRO-1    reduce-scatter 4 Psi once         all-gather b Psi once      (4 + b) Psi (N-1)/N
//   2 ZeRO-2    reduce-scatter 4 Psi per micro    all-gather b Psi once      (4m + b) Psi (N-1)/N
//   3 ZeRO-3    reduce-scatter 4 Psi per micro    all-gather b Psi twice     (4 + 2b) Psi (N-1)/N
//                                                 per micro (the root once)  per micro
//
// A ring all-reduce is a reduce-scatter followed by an all-gather; ZeRO-1 keeps the first half
// on the gradients and moves the second half after the update, onto the weights: in fp32 exactly
// DDP's bytes, in bf16 fewer (the weights travel in bf16). ZeRO-1 reduces once per step however
// many micro-batches (the full gradient accumulates locally, DDP's no_sync); ZeRO-2 gives that
// up to hold 1/N of the gradients: each micro-batch's buckets are reduce-scattered into a shard
// accumulator.
//
// Overlap. The buckets are reduced on the comm stream while the backward of the units before
// them runs (as DDP's; one unit per bucket, or with [parallel] bucket_mb several consecutive ones
// in one reduce-scatter, parallel/grad_buckets.cu); the all-gathers run on the comm stream after the update, one per unit,
// and the forward of the next step waits for each unit's own gather only, so the first blocks
// compute while the last ones are still being gathered.
//
//   compute  |bwd L|bwd L-1| ... |bwd 0|emb|  |AdamW on the shards|      |fwd 0|fwd 1|...
//   comm           |RS L   | ...       |RS 0|RS root|             |AG 0|AG 1|AG 2|...
#include "parallel/param_store.h"

// The full working copy (the shard this rank updates is a slice of it) and, for ZeRO-1, the full
// gradient (the shard's sum lands in its slice); ZeRO-2's gradients are sharded
// (parallel/sharded_grads.cu: a shard per unit and a small pool of unit-sized buckets).
void zero_init(ParamStore& st) {
  const size_t elem = dtype_size(st.dt);
  for (UnitState& us : st.units) {
    us.params = allocate_zeroed(st.state_memory, us.padded_numel * elem, st.compute);
    us.param_shard = (char*)us.params + us.shard_offset * elem;
    us.gather_done = allocate_event(st.work_memory);
    if (st.mode != ShardingMode::ZeRO1) continue;
    us.grad_full = (float*)allocate_zeroed(st.state_memory, us.padded_numel * sizeof(float),
                                           st.compute);
    us.grad = us.grad_full + us.shard_offset;
    us.reduce_done = allocate_event(st.work_memory);
  }
  if (st.mode == ShardingMode::ZeRO2) sharded_grads_init(st);
}

// The weights are always whole; the compute stream waits for this unit's gather only.
void* zero_params_acquire(ParamStore& st, int unit) {
  UnitState& us = st.units[unit];
  ops::stream_wait_event(st.compute, us.gather_done);
  return us.params;
}

// ZeRO-1: after the last micro-step, the bucket (the whole unit's gradient, padding included) is
// reduce-scattered in place: rank r's shard of the sum lands in its own slice (us.grad). The
// store's BucketReduction: one reduce-scatter, or its compressed variant
// (parallel/grad_compression.cu).
void zero1_grads_release(ParamStore& st, int unit, bool last_micro_step) {
  if (!last_micro_step) return;
  UnitState& us = st.units[unit];
  ops::event_record(us.reduce_done, st.compute);  // the bucket is complete on the compute stream
  ops::stream_wait_event(st.comm, us.reduce_done);
  reduce_scatter_bucket(st, unit, us.grad_full, us.grad);
}

// ZeRO-2: every micro-step's buckets are reduce-scattered into the gradient shards
// (parallel/sharded_grads.cu: sharded_grads_acquire and sharded_grads_release).

// Every rank's updated shard to every rank, in place: each contributes the slice it updated.
void zero_gather_weights(ParamStore& st) {
  comm_after_compute(st);  // the update of the shards is queued on the compute stream
  for (UnitState& us : st.units) {
    all_gather(*us.group, us.param_shard, us.params, us.shard_numel, st.dt, st.comm);
    ops::event_record(us.gather_done, st.comm);
  }
}
