// parallel/param_store.h - who holds which weights, gradients and optimizer state.
//
// The model asks the store for a unit's weights right before it uses them and for a unit's
// gradient buffer right before its backward; what happens underneath depends on the mode, the
// rungs of the ZeRO ladder ([parallel] zero; the bytes of each at the top of parallel/zero.cu):
//
//   Replicated (zero = 0: one rank, or DDP, parallel/ddp.cu): every rank keeps every unit - fp32
//     master, Adam m and v, fp32 gradients and the compute-dtype working copy (which is the
//     master itself in fp32). After the last micro-step's backward of a unit its gradient bucket
//     is all-reduced over dp, overlapping the backward of the units before it.
//   ZeRO-1 (parallel/zero.cu): full weights and gradients as DDP, but the master and moments of
//     1/dp of each unit only; the bucket is reduce-scattered (each rank needs its shard's sum),
//     and after the update the new weights are all-gathered.
//   ZeRO-2 (parallel/zero.cu): ZeRO-1 with the gradients sharded too: each bucket is
//     reduce-scattered every micro-step into the rank's gradient shard (parallel/sharded_grads.cu,
//     FSDP's gradient path too).
//   FSDP / ZeRO-3 (zero = 3, parallel/fsdp.cu): each rank owns 1/dp of every unit (flat, padded
//     shards) of the master, m, v, the gradient and the working copy; full weights exist only
//     between acquire and release.
// The side roads keep their state beside the units, each in its own struct and file: optimizer
// offload (ZeRO 1-3, Offload, parallel/offload.cu) moves the master and moments of the shard to
// host memory or a file, and AdamW to the host; compressed reductions (CompressedGrads,
// parallel/grad_compression.cu) replace the plain bucket reduction once, at init
// (BucketReduction); the noise scale's measurement (SmallBatchNorm,
// parallel/small_batch_norm.cu) and DiLoCo's outer state (OuterState, parallel/diloco.cu).
//
// All keep the same flat layout (parallel/placement.h) and the same shards, so the optimizer,
// the gradient norm and the checkpoints work on "this rank's range [shard_offset, shard_offset +
// shard_numel) of unit u" and never care which mode produced it (Replicated: the whole unit).
//
// Units are what the placement map says they are on this rank: under tensor parallelism a unit
// holds this tp rank's blocks, and the ZeRO stages shard that local unit over the unit's own
// group (ParamUnit::grad_axis: dp, or dp x cp when cp > 1; for experts, the ranks that hold the
// same experts). "dp" above stands for that group; under HSDP ([parallel] dp_replicate,
// parallel/hsdp.cu) for its shard sub-group, and after the last micro-step the shard's gradient
// is all-reduced over the unit's replicas. After the gradients of the step are reduced
// over that group, the range whose gradients are partial over tp (LayerNorms under sequence
// parallelism) is summed over tp. The gradient norm counts each element of each logical tensor
// once, whichever ranks hold copies of it.
#pragma once
#include <string>
#include <vector>

#include "config/config.h"
#include "kernels/allocator.h"
#include "kernels/ops.h"
#include "parallel/comm.h"
#include "parallel/diloco_state.h"
#include "parallel/grad_compression.h"
#include "parallel/offload.h"
#include "parallel/placement.h"
#include "parallel/small_batch_norm.h"

// The rungs of the ladder, in order: ZeRO stage = (int)mode.
enum class ShardingMode { Replicated = 0, ZeRO1 = 1, ZeRO2 = 2, FSDP = 3 };
ShardingMode sharding_mode(int zero);          // [parallel] zero
const char* sharding_mode_name(ShardingMode m); // "DDP", "ZeRO-1", "ZeRO-2", "FSDP (ZeRO-3)"
OffloadKind offload_kind(const std::string& s);  // [train] optimizer_offload

// What every mode keeps of a unit: its place (group, ranges, shard), the optimizer state of the
// shard, and the buffers the model reads and writes. The pointers are the same four roles at
// every rung; which memory each points into is the mode's (parallel/ddp.cu, zero.cu, fsdp.cu
// allocate them):
//   param_shard  the working copy of the shard: DDP the whole unit, ZeRO-1/2 a slice of params,
//                FSDP a buffer of its own
//   params       the full working copy: always there under DDP and ZeRO-1/2, under FSDP a pooled
//                buffer between acquire and release
//   grad_full    the full gradient the backward writes: always there under DDP and ZeRO-1 (the
//                micro-steps accumulate in it), a pooled bucket under ZeRO-2 and FSDP
//   grad         the gradient the optimizer reads: the shard's (DDP: the whole unit)
// The side roads keep their state beside the units, in their own structs (ParamStore below).
struct UnitState {
  Comm* group = nullptr;    // sums the unit's gradient; the ZeRO stages shard over it
  Comm* replica = nullptr;  // HSDP: the replicas that all-reduce the shard (parallel/hsdp.cu)
  size_t numel = 0;         // the unit's flat length (parallel/placement.h)
  size_t owned_end = 0;     // [0, owned_end): this tp rank's to count (placement.h)
  size_t partial_begin = 0; // [partial_begin, numel): partial gradients (sequence parallel)
  // [tp_sum_begin, numel): summed over tp after the dp reduction. partial_begin, except under
  // grad_compression when the unit mixes tp-specific elements with replicated complete ones:
  // then it starts at the first replicated tensor (parallel/grad_compression.cu says why).
  size_t tp_sum_begin = 0;
  size_t replicated_begin = 0;  // the first tensor replicated over tp (numel: none)
  size_t padded_numel = 0;  // numel rounded up so that it splits into dp equal aligned shards
  size_t shard_offset = 0;  // first element of the unit this rank owns
  size_t shard_numel = 0;   // elements this rank owns (Replicated: numel)
  // The optimizer state of the shard, on the device; null under optimizer offload (the state is
  // the Offload's). In fp32 the master is the working copy's shard itself (param_shard).
  float* master = nullptr;  // fp32 weights, shard_numel
  float* adam_m = nullptr;
  float* adam_v = nullptr;
  float* grad = nullptr;        // fp32 gradient of the shard (Replicated: of the whole unit)
  void* param_shard = nullptr;  // the working copy (compute dtype) of the shard
  void* params = nullptr;       // full compute-dtype weights; valid between acquire and release
  float* grad_full = nullptr;   // full fp32 gradient; valid between acquire and release
  bool whole_step = false;  // acquired once per step; FSDP keeps its own full buffers (the root)
  bool tied = false;        // gradient summed over the embedding group after the step (pp > 1)
  ops::Event gather_done = nullptr;  // ZeRO-1/2, FSDP: the all-gather of params is done
  ops::Event reduce_done = nullptr;  // DDP, ZeRO-1: the bucket is complete on the compute stream
};

// A small pool of full-unit buffers, enough for the unit in use plus the one being prefetched
// (ParamStore::pool_slots: fsdp_pool_slots): FSDP's gathered weights, and the gradient buckets
// of ZeRO-2 and FSDP (parallel/sharded_grads.cu). Units take a slot at acquire and give it back
// at release, in order.
struct UnitBufferPool {
  std::vector<void*> buffers;
  std::vector<int> owner;    // the unit using each slot, -1 if free
  std::vector<int> slot_of;  // per unit: the slot it holds, -1 if none
};
// `slots` buffers of `bytes` each from `memory`, for a store of `units` units, all free.
void pool_init(UnitBufferPool& pool, int slots, size_t bytes, size_t units, Allocator& memory);
int pool_take(UnitBufferPool& pool, int unit);  // the slot (FATAL when none is free)
void pool_give_back(UnitBufferPool& pool, int unit);

struct ParamStore;
// How a gradient bucket is summed over its unit's group, on the comm stream; chosen once by
// param_store_init: the plain collectives (parallel/comm.h), or with [parallel] grad_compression
// the compressed ones with error feedback (parallel/grad_compression.cu).
struct BucketReduction {
  // bucket: the unit's numel floats, replaced by their sum over the group.
  void (*all_reduce)(ParamStore& store, int unit, float* bucket) = nullptr;
  // full: the unit's padded_numel floats; this rank's shard of their sum into shard
  // (shard_numel floats, which may lie inside full).
  void (*reduce_scatter)(ParamStore& store, int unit, float* full, float* shard) = nullptr;
};
BucketReduction plain_bucket_reduction();

// [parallel] bucket_mb (parallel/grad_buckets.cu): consecutive units whose gradients travel in
// one reduction. A rank's part of the bucket is its shard of each unit, one after the other (DDP:
// the whole units); the staging buffer holds every rank's part, rank by rank.
struct GradBucket {
  std::vector<int> units;      // consecutive unit indices: one group, one replica, one stage
  std::vector<size_t> offset;  // each unit's first element in a rank's part
  size_t part = 0;             // elements of one rank's part
  int released = 0;            // units released since the bucket last went out
};

struct ParamStore {
  ShardingMode mode = ShardingMode::Replicated;
  DType dt = DType::F32;   // compute dtype of the working copy
  Comm* tp = nullptr;      // the tensor-parallel group (sums the partial gradients)
  Comm* world = nullptr;   // every rank (the gradient norm)
  Comm* embed = nullptr;   // first and last pipeline stage (the tied root's gradients)
  std::vector<UnitState> units;
  ops::Stream compute = nullptr;  // the stream the model runs on
  ops::Stream comm = nullptr;     // collectives, so that they overlap compute
  BucketReduction reduction;      // set by param_store_init
  // [parallel] reduce_dtype (parallel/reduce_dtype.cu): the dtype of the plain reductions, and
  // their bf16 scratch (working memory) when it is not fp32.
  DType reduce_dt = DType::F32;
  void* reduce_scratch_bf16 = nullptr;
  // [parallel] bucket_mb and the buckets of more than one unit (parallel/grad_buckets.cu);
  // bucket_of[u] = -1: unit u goes out alone, as it does by default.
  double bucket_mb = 0;
  std::vector<GradBucket> buckets;
  std::vector<int> bucket_of;
  float* bucket_staging = nullptr;  // every rank's part of the bucket going out (fp32)
  float* bucket_scratch = nullptr;  // this rank's part of a reduce-scatter's sum
  // FSDP's gathered weights (compute dtype) and the gradient buckets of ZeRO-2 and FSDP (fp32).
  // The gather pool holds fsdp_prefetch - 1 more than pool_slots ([parallel] fsdp_prefetch).
  int pool_slots = 2;
  int fsdp_prefetch = 1;
  UnitBufferPool gather_pool, grad_pool;
  std::vector<char> gathered;  // FSDP, per unit: its gather is issued and not yet released
  std::vector<ops::Event> grad_slot_reduced;  // the last reduce-scatter out of a slot is done
  float* reduce_scratch = nullptr;  // one shard-sized buffer the reduce-scatter lands in
  ops::Event issue_point = nullptr;  // "everything queued on compute so far"
  // The step's gradient norm on the device (grad_norm): [0] this rank's sum of squares, then
  // every rank's of the world, gathered; the norm and the clipping factor AdamW reads.
  float* norm_parts = nullptr;     // 1 + world size floats
  double* norm = nullptr;          // one double
  float* clip_factor = nullptr;    // one float
  ops::Event comm_idle = nullptr;  // recorded on the comm stream by grads_wait
  // Device memory: the state (master, m, v, grad, working copy: the bytes the banner and the
  // planner report) and the working buffers (FSDP's full-unit buffers, scratch, events).
  Allocator state_memory, work_memory;
  bool count_only = false;  // set before param_store_init: count the memory, allocate nothing
  // The side roads, each with its state in its own struct and file; store_options sets what
  // each needs before param_store_init.
  Offload offload;             // [train] optimizer_offload (parallel/offload.h)
  CompressedGrads compression; // [parallel] grad_compression (parallel/grad_compression.h)
  SmallBatchNorm small_batch;  // [log] grad_noise_scale (parallel/small_batch_norm.h)
  OuterState outer;            // [parallel] diloco_islands (parallel/diloco_state.h)
  // Names the offload file: set it before param_store_init where the store's world is not the
  // job's (DiLoCo islands: each island's ranks count from 0); -1 = the store's world rank.
  int world_rank = -1;
};

// Allocates the store for `units` (this rank's placement) and fills this rank's master shard with
// `fill` (parallel/placement.h: random init, llm.c import and checkpoints are fills). With
// count_only (the planner) it only counts the memory; fill is not called.
void param_store_init(ParamStore& store, const std::vector<ParamUnit>& units, ShardingMode mode,
                      DType dt, const CommsByAxis& comms, ops::Stream compute, ops::Stream comm,
                      const ParamFill& fill);
void param_store_destroy(ParamStore& store);
// What a config asks of the store, as the trainer and the planner make it: the mode of
// [parallel] zero (returned), the offload of [train] optimizer_offload and offload_dir and the
// compression of [parallel] grad_compression and topk_ratio (set on `store`, before
// param_store_init).
ShardingMode store_options(ParamStore& store, const Config& cfg);
bool store_offloaded(const ParamStore& store);  // optimizer offload is on
bool store_compressed(const ParamStore& store);  // [parallel] grad_compression is not "none"
// The fp32 states a shard carries; checkpoints save and load all of them: the master and Adam's
// moments always, DiLoCo's synchronised weights and outer momentum with diloco_islands >= 1.
enum class StateKind { Master, AdamM, AdamV, OuterSync, OuterMomentum };
// "model", "optim/m", "optim/v", "diloco/sync", "diloco/m"
inline const char* state_kind_name(StateKind k) {
  switch (k) {
    case StateKind::Master: return "model";
    case StateKind::AdamM: return "optim/m";
    case StateKind::AdamV: return "optim/v";
    case StateKind::OuterSync: return "diloco/sync";
    case StateKind::OuterMomentum: return "diloco/m";
  }
  return "?";
}
inline bool is_outer_state(StateKind k) {
  return k == StateKind::OuterSync || k == StateKind::OuterMomentum;
}
// Elements [first, first + count) (unit-relative, inside this rank's shard) of one state of unit
// u, into host memory, wherever the state lives (device, host, file). The compute stream must be
// idle and the optimizer step finished.
void store_state_read(ParamStore& store, int unit, StateKind k, size_t first, size_t count,
                      float* host);
// Overwrites one state of every shard from `fill` (loading the master also refreshes the
// compute-dtype working copies, and ZeRO-1/2 gather them).
void param_store_load(ParamStore& store, const std::vector<ParamUnit>& units,
                      const ParamFill& fill, StateKind kind = StateKind::Master);
// Zeroes the store's per-step counters (offload traffic); the trainer and the planner call it
// where they reset the communication counters.
void store_stats_reset(ParamStore& store);

// The model's side. params_prefetch names the unit the model will acquire next (FSDP starts its
// gather so that it overlaps the current unit's compute; DDP: nothing to do).
void* params_acquire(ParamStore& store, int unit);
void params_prefetch(ParamStore& store, int unit);
void params_release(ParamStore& store, int unit);
float* grads_acquire(ParamStore& store, int unit);
void grads_release(ParamStore& store, int unit, bool last_micro_step);
// The backward of a micro-batch is queued (this stage's every contribution, the embedding's too).
void grads_micro_batch_done(ParamStore& store);

// The optimizer's side (training/optimizer.cu).
void grads_zero(ParamStore& store);
// After the last micro-step: partial gradients summed over tp, and every outstanding reduction
// finished on the compute stream.
void grads_wait(ParamStore& store);
// The global L2 norm, each logical element counted once, and the clipping factor of [train]
// grad_clip, into store.norm and store.clip_factor on the device: queued on the compute stream,
// the host does not wait (AdamW reads the factor there). grad_norm_read waits and returns the
// norm, for the logs and the noise scale.
void grad_norm(ParamStore& store, float grad_clip);
double grad_norm_read(ParamStore& store);
// Pipeline parallelism: whether the first and the last stage's copies of every tied unit hold
// bitwise-equal fp32 weights (the pair exchange their shards on the host). Collective over the
// world.
bool tied_copies_equal(ParamStore& store);
// Tensor parallelism: whether every tp rank holds bitwise-equal fp32 weights of every replicated
// tensor (each unit's [first replicated tensor, numel) of its shard; the tp ranks exchange them on
// the host). Collective over the world.
bool tp_replicas_equal(ParamStore& store);
// The update of one unit's shard, in unit order: update_begin says where AdamW finds the shard
// (device or host memory; offload first waits for the gradient and the file), shard_adamw runs
// it on a range, update_end sends the new weights where they are used (offload: up to the
// device, the state back to its file), and updates_done finishes the step: ZeRO-1/2 all-gather
// the new weights, offload waits for its files and notes the host time.
struct ShardForUpdate {
  float *master = nullptr, *m = nullptr, *v = nullptr;
  const float* grad = nullptr;
  void* copy = nullptr;   // the compute-dtype copy AdamW writes too, when writes_copy
  bool writes_copy = false;  // false: the master is the working copy (fp32 on the device)
  size_t offset = 0;      // unit-relative index of element 0 (shard_offset)
  bool on_host = false;   // host memory: the host AdamW runs (kernels/host_adamw.h)
};
ShardForUpdate update_begin(ParamStore& store, int unit);
// AdamW over the unit-relative elements [first, end) of the shard.
void shard_adamw(ParamStore& store, const ShardForUpdate& s, size_t first, size_t end,
                 const AdamWStep& step);
void update_end(ParamStore& store, int unit);
void updates_done(ParamStore& store);

// A gradient bucket summed over the unit's group by the store's BucketReduction (above).
void reduce_bucket(ParamStore& store, int unit, float* bucket);
void reduce_scatter_bucket(ParamStore& store, int unit, float* full, float* shard);

// Per-mode implementations behind the functions above.
void ddp_init(ParamStore& store);
void* ddp_params_acquire(ParamStore& store, int unit);
float* ddp_grads_acquire(ParamStore& store, int unit);
void ddp_grads_release(ParamStore& store, int unit, bool last_micro_step);
void zero_init(ParamStore& store);
void* zero_params_acquire(ParamStore& store, int unit);
void zero1_grads_release(ParamStore& store, int unit, bool last_micro_step);
void zero_gather_weights(ParamStore& store);
// The sharded gradients of ZeRO-2 and FSDP (parallel/sharded_grads.cu).
void sharded_grads_init(ParamStore& store);
float* sharded_grads_acquire(ParamStore& store, int unit);
void sharded_grads_release(ParamStore& store, int unit);
void fsdp_init(ParamStore& store);
void* fsdp_params_acquire(ParamStore& store, int unit);
void fsdp_params_prefetch(ParamStore& store, int unit);
void fsdp_params_release(ParamStore& store, int unit);
// [parallel] reduce_dtype (parallel/reduce_dtype.cu): its DType; the scratch; fp32 gradients
// summed over `group` on the comm stream in reduce_dt: in place (n values), or rank r's shard of
// the sum of full (group.size * shard_n values) into shard.
DType reduce_dtype(const std::string& s);
void reduce_dtype_init(ParamStore& store);
void grad_sum(ParamStore& store, Comm& group, float* buf, size_t n);
void grad_sum_scatter(ParamStore& store, Comm& group, const float* full, float* shard,
                      size_t shard_n);
// Gradient buckets (parallel/grad_buckets.cu): plan them from bucket_mb (after the mode's init,
// before reduce_dtype_init); whether a unit travels in a bucket of several; its release.
void grad_buckets_init(ParamStore& store, const std::vector<ParamUnit>& units);
bool in_grad_bucket(const ParamStore& store, int unit);
void grad_bucket_release(ParamStore& store, int unit, bool last_micro_step);
// A unit's gradient summed over its group for the step (its last micro-step's reduction is
// queued): HSDP's replica sum and the offload's copy to the host follow (param_store.cu).
void unit_grads_reduced(ParamStore& store, int unit);
// HSDP (parallel/hsdp.cu): the shard's gradient summed over the unit's replicas.
void hsdp_reduce_replicas(ParamStore& store, int unit);
// Optimizer offload (parallel/offload.cu).
void offload_init(ParamStore& store);
void offload_destroy(ParamStore& store);
void offload_grad_to_host(ParamStore& store, int unit);  // queued once the gradient is final
ShardForUpdate offload_update_begin(ParamStore& store, int unit);
void offload_update_end(ParamStore& store, int unit);
void offload_updates_done(ParamStore& store);
void offload_state_read(ParamStore& store, int unit, StateKind k, size_t first, size_t count,
                        float* host);
void offload_state_write(ParamStore& store, int unit, StateKind k, const float* host);
std::string offload_banner(const ParamStore& store);  // the banner's line; empty without offload
// The comm stream waits for all work queued so far on the compute stream.
void comm_after_compute(ParamStore& store);
