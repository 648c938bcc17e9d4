// parallel/fsdp.cu - Fully Sharded Data Parallel (ZeRO-3): each of the dp ranks keeps 1/dp of
// every weight, gradient and optimizer moment, and sees a full layer only while computing it.
// The top rung of the ZeRO ladder (parallel/zero.cu has the rungs below it and the bytes of
// each). The gradient path - a bucket per unit reduce-scattered into the gradient shards - is
// ZeRO-2's too and lives in parallel/sharded_grads.cu; this file is the weights' half: gather,
// compute, release.
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
// Prefetch depth ([parallel] fsdp_prefetch = N, default 1, torchtitan's and FSDP2's
// prefetch/limit_all_gathers knobs): while u computes, the next N units of the pass are being
// gathered (params_prefetch on each, model/gpt.cu: prefetch_ahead), so a slow or jittery gather
// has N units' compute to hide behind instead of one. The price is memory: the gather pool holds
// N + 1 block-sized buffers (one more with MoE's paired experts) instead of 2, N - 1 more
// blocks' weights in the compute dtype (the planner counts them; test_plan checks the
// difference). The bytes and the order of the gathers are the same at any N, only issued earlier;
// the arithmetic is untouched, so the losses are bitwise those of N = 1. N = 2:
//
//   compute  |blk 0 |blk 1 |blk 2 |blk 3 | ...
//   comm     |AG 1 AG 2|AG 3 |AG 4 |          (two gathered ahead of the block computing)
//
// Ordering without host waits: a gather waits (on the comm stream) for everything queued on
// the compute stream before it was issued - which includes the optimizer step that produced
// the shard and the last use of the buffer it overwrites - and the compute stream waits for
// the gather's event before the unit's kernels. On the CPU backend all of this is synchronous.
#include "parallel/param_store.h"

#include <algorithm>

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
  pool_init(st.gather_pool, st.pool_slots + st.fsdp_prefetch - 1, largest_block * elem,
            st.units.size(), work);
  st.gathered.assign(st.units.size(), 0);
  sharded_grads_init(st);
}

// Starts the all-gather of unit u's weights into its buffer (no-op if already under way).
static void start_gather(ParamStore& st, int u) {
  UnitState& us = st.units[u];
  if (st.gathered[u]) return;
  if (!us.whole_step) us.params = st.gather_pool.buffers[pool_take(st.gather_pool, u)];
  comm_after_compute(st);
  all_gather(*us.group, us.param_shard, us.params, us.shard_numel, st.dt, st.comm);
  ops::event_record(us.gather_done, st.comm);
  st.gathered[u] = 1;
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
  st.gathered[unit] = 0;
  if (us.whole_step) return;  // the root's buffer is its own
  pool_give_back(st.gather_pool, unit);
  us.params = nullptr;
}

// The gradients: parallel/sharded_grads.cu.
