// parallel/sharded_grads.cu - sharded gradients: each rank of a unit's group keeps the summed
// gradient of its shard only, and the full gradient of a unit exists for one backward. ZeRO-2
// (parallel/zero.cu) and FSDP (parallel/fsdp.cu) both run this gradient path.
//
// The idea. The optimizer of rank r updates the shard r of every unit (parallel/placement.h:
// shard_range), so it needs only the sum over the group of that shard's gradients, not the whole
// unit's. The backward of a unit writes its full local gradient into a bucket; as soon as it is
// queued the bucket is reduce-scattered, and each rank adds its shard of the sum to its
// accumulated shard gradient - every micro-batch, so gradient accumulation happens on shards:
//
//   grads_acquire(u)   take a bucket from the pool, zero it            (compute stream)
//   backward of u      writes the unit's local gradient into it
//   grads_release(u)   reduce-scatter the bucket over the group        (comm stream)
//                      grad_shard(u) += this rank's shard of the sum
//                      the bucket goes back to the pool
//
// Who holds what, per rank (N parameters, G ranks in the group): the fp32 gradient shards, 4N/G
// bytes of state, plus the pool of unit-sized fp32 buckets (two or three: the unit computing and
// the one being reduced; ParamStore::pool_slots), the root's own bucket (the root - embeddings +
// final LayerNorm - is used from the start of the forward to the end of the backward) and one
// shard-sized buffer the reduce-scatter lands in. Bytes: a reduce-scatter of each unit's 4 x
// padded_numel bytes per micro-batch, (G-1)/G of it on the wire per rank in a ring.
//
// With [parallel] bucket_mb the release copies the unit's gradient into a bucket of several units
// and gives the pool buffer back; the bucket is reduce-scattered when its last unit is released
// (parallel/grad_buckets.cu).
//
// Ordering without host waits: a bucket is reused only after the reduce-scatter out of it is
// done (an event per pool slot, waited for on the compute stream before the next unit's backward
// writes it), and the reduce-scatter waits for everything queued on the compute stream before it.
#include "parallel/param_store.h"

#include <algorithm>

void pool_init(UnitBufferPool& pool, int slots, size_t bytes, size_t units, Allocator& memory) {
  pool.slot_of.assign(units, -1);
  for (int i = 0; i < slots; i++) {
    pool.buffers.push_back(allocate(memory, bytes));
    pool.owner.push_back(-1);
  }
}

int pool_take(UnitBufferPool& pool, int unit) {
  for (size_t i = 0; i < pool.owner.size(); i++)
    if (pool.owner[i] < 0) {
      pool.owner[i] = unit;
      pool.slot_of[unit] = (int)i;
      return (int)i;
    }
  FATAL("param store: no free unit buffer for unit %d: units must be acquired and released "
        "in order", unit);
}

void pool_give_back(UnitBufferPool& pool, int unit) {
  pool.owner[pool.slot_of[unit]] = -1;
  pool.slot_of[unit] = -1;
}

// Each unit's fp32 gradient shard (state), the pool of full-unit buckets a block's gradient
// lives in during its backward, the root's own one, and the shard-sized buffer each
// reduce-scatter lands in.
void sharded_grads_init(ParamStore& st) {
  size_t largest_block = 0, largest_shard = 0;
  Allocator& work = st.work_memory;
  for (UnitState& us : st.units) {
    us.grad = (float*)allocate_zeroed(st.state_memory, us.shard_numel * sizeof(float), st.compute);
    largest_shard = std::max(largest_shard, us.shard_numel);
    if (us.whole_step) us.grad_full = (float*)allocate(work, us.padded_numel * sizeof(float));
    else largest_block = std::max(largest_block, us.padded_numel);
  }
  pool_init(st.grad_pool, st.pool_slots, largest_block * sizeof(float), st.units.size(), work);
  for (int i = 0; i < st.pool_slots; i++) st.grad_slot_reduced.push_back(allocate_event(work));
  st.reduce_scratch = (float*)allocate(work, largest_shard * sizeof(float));
}

float* sharded_grads_acquire(ParamStore& st, int unit) {
  UnitState& us = st.units[unit];
  if (!us.whole_step) {
    const int slot = pool_take(st.grad_pool, unit);
    us.grad_full = (float*)st.grad_pool.buffers[slot];
    // the previous reduce-scatter out of this buffer must be done before we overwrite it
    ops::stream_wait_event(st.compute, st.grad_slot_reduced[slot]);
  }
  ops::fill_zero(us.grad_full, us.padded_numel * sizeof(float), st.compute);
  return us.grad_full;
}

// Reduce-scatter the unit's full gradient (the store's BucketReduction: plain, or compressed
// under ZeRO-2, parallel/grad_compression.cu); each rank adds the sum of its shard to its
// accumulated shard gradient.
void sharded_grads_release(ParamStore& st, int unit) {
  UnitState& us = st.units[unit];
  comm_after_compute(st);
  reduce_scatter_bucket(st, unit, us.grad_full, st.reduce_scratch);
  ops::add_inplace(us.grad, st.reduce_scratch, us.shard_numel, st.comm);
  if (us.whole_step) return;
  ops::event_record(st.grad_slot_reduced[st.grad_pool.slot_of[unit]], st.comm);
  pool_give_back(st.grad_pool, unit);
  us.grad_full = nullptr;
}
