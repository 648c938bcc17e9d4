// parallel/fsdp.cu - Fully Sharded Data Parallel (ZeRO-3): each of the dp ranks keeps 1/dp of
// every weight, gradient and optimizer moment, and sees a full layer only while computing it.
// The top rung of the ZeRO ladder (parallel/zero.cu has the rungs below it and the bytes of
// each); ZeRO-2 runs the gradient half of this file (fsdp_grad_buffers_init, fsdp_grads_*).
//
// The idea. Data parallelism replicates the model: with N parameters, every rank holds the fp32
// weights, gradients and both Adam moments, 16N bytes, however many ranks there are. But a rank
// needs the full weights of a layer only while that layer runs, and the optimizer update is
// elementwise, so each rank can own one slice (a shard) of everything and borrow the rest:
//
//   forward, layer l:   all-gather layer l's weights from all shards -> compute -> free them
//   backward, layer l:  all-gather again -> compute -> free; reduce-scatter the layer's
//                       gradient so that each rank receives the summed gradient of its shard
//   step:               AdamW on the shard only (fp32 master, m, v of N/dp elements)
//
// Who holds what, per rank (dp ranks, N parameters, compute dtype of b bytes):
//   always:      fp32 master, m, v and gradient of its shard: 16N/dp bytes (+ bN/dp working copy
//                of the shard in bf16 mode; in fp32 the master is the working copy)
//   transiently: the root unit (embeddings + final LayerNorm) in full from the start of the
//                forward to the end of the backward (the tied embedding is used at both ends),
//                two block-sized weight buffers (the block computing + the one being fetched) and
//                two block-sized fp32 gradient buffers (the block computing + the one being
//                reduce-scattered).
// Shards are flat and padded: a unit's buffer is padded to a multiple of dp*64 elements and
// rank r owns the r-th equal slice, regardless of tensor boundaries (shard_range in
// parallel/placement.h). Under tensor parallelism the unit is this tp rank's part of it, and
// FSDP shards that: the state per rank is divided by tp x dp.
//
// Who talks to whom: all ranks of the dp group. Bytes per micro-batch, fp32, ring algorithms,
// per rank on the wire: all-gather (dp-1)/dp * 4N forward, the same in the backward (the root
// is not gathered twice), reduce-scatter (dp-1)/dp * 4N: about 3 * (dp-1)/dp * 4N against DDP's
// all-reduce of 2 * (dp-1)/dp * 4N, i.e. 1.5x DDP. In bf16 the gathers move bf16 weights
// (half the bytes) while gradients are reduced in fp32.
//
// Overlap. Collectives run on a second stream. When the model acquires unit u it names the unit
// it will need next (params_prefetch: block l+1 in the forward, l-1 in the backward, and at the
// end of a pipeline action the first unit of the schedule's next one), whose gather starts at
// once and runs while u computes; the reduce-scatter of u's gradient starts as soon as u's
// backward is queued. The root is gathered once per step and reduce-scattered once per step:
//
//   compute  |emb|blk 0 |blk 1 |blk 2 | ... |head|  |bwd 2 |bwd 1 |bwd 0 |emb|
//   comm     |AG 1|AG 2  |AG 3  |            ...|AG 2|AG 1  |AG 0  |
//                                                     |RS 2  |RS 1  |RS 0|RS root|
//
// Ordering without host waits: a gather waits (on the comm stream) for everything queued on
// the compute stream before it was issued - which includes the optimizer step that produced
// the shard and the last use of the buffer it overwrites - and the compute stream waits for
// the gather's event before the unit's kernels. On the CPU backend all of this is synchronous.
#include "parallel/param_store.h"

#include <algorithm>

static int take_slot(std::vector<int>& owner, int unit) {
  for (size_t i = 0; i < owner.size(); i++)
    if (owner[i] < 0) {
      owner[i] = unit;
      return (int)i;
    }
  FATAL("FSDP: no free buffer for unit %d: units must be acquired and released in order", unit);
}

// The sharded gradients, ZeRO-2's as well: each unit's fp32 gradient shard (state), the pool of
// full-unit gradient buffers a bucket lives in during its backward, the root's own one, and the
// shard-sized buffer each reduce-scatter lands in.
void fsdp_grad_buffers_init(ParamStore& st) {
  size_t largest_block = 0, largest_shard = 0;
  Allocator& work = st.work_memory;
  for (UnitState& us : st.units) {
    us.grad = (float*)allocate_zeroed(st.state_memory, us.shard_numel * sizeof(float), st.compute);
    us.reduce_done = allocate_event(work);
    largest_shard = std::max(largest_shard, us.shard_numel);
    if (us.whole_step) us.grad_full = (float*)allocate(work, us.padded_numel * sizeof(float));
    else largest_block = std::max(largest_block, us.padded_numel);
  }
  for (int i = 0; i < st.pool_slots; i++) {
    st.grad_pool.push_back((float*)allocate(work, largest_block * sizeof(float)));
    st.grad_owner.push_back(-1);
    st.grad_slot_reduced.push_back(allocate_event(work));
  }
  st.reduce_scratch = (float*)allocate(work, largest_shard * sizeof(float));
}

// The weights: each unit's shard of the working copy (state; in fp32 also the master,
// parallel/param_store.cu), the pool of gathered full units, the root's own one.
void fsdp_init(ParamStore& st) {
  const size_t elem = dtype_size(st.dt);
  size_t largest_block = 0;
  Allocator& work = st.work_memory;
  for (UnitState& us : st.units) {
    us.param_shard = allocate_zeroed(st.state_memory, us.shard_numel * elem, st.compute);
    us.gather_done = allocate_event(work);
    if (us.whole_step) us.params = allocate(work, us.padded_numel * elem);  // the root's own
    else largest_block = std::max(largest_block, us.padded_numel);
  }
  for (int i = 0; i < st.pool_slots; i++) {
    st.gather_pool.push_back(allocate(work, largest_block * elem));
    st.gather_owner.push_back(-1);
  }
  fsdp_grad_buffers_init(st);
}

// Starts the all-gather of unit u's weights into its buffer (no-op if already under way).
static void start_gather(ParamStore& st, int u) {
  UnitState& us = st.units[u];
  if (us.gathered) return;
  if (!us.whole_step) {
    us.gather_slot = take_slot(st.gather_owner, u);
    us.params = st.gather_pool[us.gather_slot];
  }
  comm_after_compute(st);
  all_gather(*us.group, us.param_shard, us.params, us.shard_numel, st.dt, st.comm);
  ops::event_record(us.gather_done, st.comm);
  us.gathered = true;
}

void* fsdp_params_acquire(ParamStore& st, int unit) {
  UnitState& us = st.units[unit];
  start_gather(st, unit);
  ops::stream_wait_event(st.compute, us.gather_done);
  return us.params;
}

void fsdp_params_prefetch(ParamStore& st, int unit) { start_gather(st, unit); }

void fsdp_params_release(ParamStore& st, int unit) {
  UnitState& us = st.units[unit];
  us.gathered = false;
  if (us.whole_step) return;  // the root's buffer is its own
  st.gather_owner[us.gather_slot] = -1;
  us.gather_slot = -1;
  us.params = nullptr;
}

float* fsdp_grads_acquire(ParamStore& st, int unit) {
  UnitState& us = st.units[unit];
  if (!us.whole_step) {
    us.grad_slot = take_slot(st.grad_owner, unit);
    us.grad_full = st.grad_pool[us.grad_slot];
    // the previous reduce-scatter out of this buffer must be done before we overwrite it
    ops::stream_wait_event(st.compute, st.grad_slot_reduced[us.grad_slot]);
  }
  ops::fill_zero(us.grad_full, us.padded_numel * sizeof(float), st.compute);
  return us.grad_full;
}

// Reduce-scatter the unit's full gradient; each rank adds the sum of its shard to its
// accumulated shard gradient (gradient accumulation over micro-steps happens on shards).
void fsdp_grads_release(ParamStore& st, int unit, bool last_micro_step) {
  UnitState& us = st.units[unit];
  comm_after_compute(st);
  if (store_compressed(st)) {  // ZeRO-2 only (parallel/grad_compression.cu)
    compressed_bucket_owner_only(st, us, us.grad_full);
    compressed_reduce_scatter(st.compressor, *us.group, us.grad_full, us.residual,
                              st.reduce_scratch, us.shard_numel, st.comm);
  } else {
    reduce_scatter_sum(*us.group, us.grad_full, st.reduce_scratch, us.shard_numel, DType::F32,
                       st.comm);
  }
  ops::add_inplace(us.grad, st.reduce_scratch, us.shard_numel, st.comm);
  if (us.whole_step) return;
  ops::event_record(st.grad_slot_reduced[us.grad_slot], st.comm);
  st.grad_owner[us.grad_slot] = -1;
  us.grad_slot = -1;
  us.grad_full = nullptr;
}
