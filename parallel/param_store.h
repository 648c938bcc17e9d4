// parallel/param_store.h - who holds which weights, gradients and optimizer state.
//
// The model asks the store for a unit's weights right before it uses them and for a unit's
// gradient buffer right before its backward; what happens underneath depends on the mode:
//
//   Replicated (one rank, or DDP, parallel/ddp.cu): every rank keeps every unit - fp32 master,
//     Adam m and v, fp32 gradients and the compute-dtype working copy (which is the master
//     itself in fp32). After the last micro-step's backward of a unit its gradient bucket is
//     all-reduced over dp, overlapping the backward of the units before it.
//   FSDP / ZeRO-3 (parallel/fsdp.cu): each rank owns 1/dp of every unit (flat, padded shards) of
//     the master, m, v and the gradient; full weights exist only between acquire and release.
//
// Both keep the same flat layout (parallel/placement.h), so the optimizer, the gradient norm and
// the checkpoints work on "this rank's range [shard_offset, shard_offset + shard_numel) of unit
// u" and never care which mode produced it.
//
// Units are what the placement map says they are on this rank: under tensor parallelism a unit
// holds this tp rank's blocks, and FSDP shards that local unit over the unit's own group
// (ParamUnit::grad_axis: dp, or dp x cp when cp > 1; for experts, the ranks that hold the same
// experts). "dp" above stands for that group. After the gradients of the step are reduced over
// that group, the range whose gradients are partial over tp (LayerNorms under sequence
// parallelism) is summed over tp. The gradient norm counts each element of each logical tensor
// once, whichever ranks hold copies of it.
#pragma once
#include <vector>

#include "kernels/allocator.h"
#include "kernels/ops.h"
#include "parallel/comm.h"
#include "parallel/placement.h"

enum class ShardingMode { Replicated, FSDP };

struct UnitState {
  Comm* group = nullptr;    // sums the unit's gradient; FSDP shards over it
  size_t numel = 0;         // the unit's flat length (parallel/placement.h)
  size_t owned_end = 0;     // [0, owned_end): this tp rank's to count (placement.h)
  size_t partial_begin = 0; // [partial_begin, numel): gradients summed over tp
  size_t padded_numel = 0;  // numel rounded up so that it splits into dp equal aligned shards
  size_t shard_offset = 0;  // first element of the unit this rank owns
  size_t shard_numel = 0;   // elements this rank owns (Replicated: numel)
  float* master = nullptr;  // fp32 weights, shard_numel
  float* adam_m = nullptr;
  float* adam_v = nullptr;
  float* grad = nullptr;    // fp32 gradient of the shard (Replicated: of the whole unit)
  void* param_shard = nullptr;  // compute-dtype copy of the shard (FSDP; aliases master in fp32)
  void* params = nullptr;   // full compute-dtype weights; valid between acquire and release
  float* grad_full = nullptr;  // full fp32 gradient during this unit's backward
  // FSDP bookkeeping
  bool whole_step = false;  // acquired once per step; FSDP keeps its own full buffers (the root)
  bool tied = false;        // gradient summed over the embedding group after the step (pp > 1)
  bool gathered = false;
  int gather_slot = -1;     // pool slot holding params (blocks only)
  int grad_slot = -1;       // pool slot holding grad_full (blocks only)
  ops::Event gather_done = nullptr;
  ops::Event reduce_done = nullptr;
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
  // FSDP: a small pool of full-unit buffers (weights in the compute dtype, gradients in fp32),
  // enough for the unit in use plus the one being prefetched (pool_slots: fsdp_pool_slots).
  int pool_slots = 2;
  std::vector<void*> gather_pool;
  std::vector<int> gather_owner;   // unit using each pool slot, -1 if free
  std::vector<float*> grad_pool;
  std::vector<int> grad_owner;
  std::vector<ops::Event> grad_slot_reduced;  // the last reduce-scatter out of a slot is done
  ops::Event issue_point = nullptr;           // "everything queued on compute so far"
  float* reduce_scratch = nullptr; // one shard-sized buffer the reduce-scatter lands in
  float* norm_scratch = nullptr;   // one float on the device
  ops::Event comm_idle = nullptr;  // recorded on the comm stream by grads_wait
  // Device memory: the state (master, m, v, grad, working copy: the bytes the banner and the
  // planner report) and the working buffers (FSDP's full-unit buffers, scratch, events).
  Allocator state_memory, work_memory;
  bool count_only = false;  // set before param_store_init: count the memory, allocate nothing
};

// Allocates the store for `units` (this rank's placement) and fills this rank's master shard with
// `fill` (parallel/placement.h: random init, llm.c import and checkpoints are fills). With
// count_only (the planner) it only counts the memory; fill is not called.
void param_store_init(ParamStore& store, const std::vector<ParamUnit>& units, ShardingMode mode,
                      DType dt, const CommsByAxis& comms, ops::Stream compute, ops::Stream comm,
                      const ParamFill& fill);
void param_store_destroy(ParamStore& store);
// The three fp32 states a shard carries; checkpoints save and load all three.
enum class StateKind { Master, AdamM, AdamV };
const char* state_kind_name(StateKind k);  // "model", "optim/m", "optim/v"
float* store_state(ParamStore& store, int unit, StateKind k);  // this rank's shard, on the device
// Overwrites one state of every shard from `fill` (loading the master also refreshes the
// compute-dtype working copies).
void param_store_load(ParamStore& store, const std::vector<ParamUnit>& units,
                      const ParamFill& fill, StateKind kind = StateKind::Master);

// The model's side. params_prefetch names the unit the model will acquire next (FSDP starts its
// gather so that it overlaps the current unit's compute; DDP: nothing to do).
void* params_acquire(ParamStore& store, int unit);
void params_prefetch(ParamStore& store, int unit);
void params_release(ParamStore& store, int unit);
float* grads_acquire(ParamStore& store, int unit);
void grads_release(ParamStore& store, int unit, bool last_micro_step);

// The optimizer's side (training/optimizer.cu).
void grads_zero(ParamStore& store);
// After the last micro-step: partial gradients summed over tp, and every outstanding reduction
// finished on the compute stream.
void grads_wait(ParamStore& store);
double grad_norm(ParamStore& store);    // global L2 norm, each logical element counted once
// Pipeline parallelism: whether the first and the last stage's copies of every tied unit hold
// bitwise-equal fp32 weights (each sends its shard to the other). Collective over the world.
bool tied_copies_equal(ParamStore& store);
// After the optimizer updated the fp32 masters: refresh the working copies where needed.
bool store_needs_param_copy(const ParamStore& store);  // adamw writes a compute-dtype copy?
void* store_param_copy(ParamStore& store, int unit);   // where that copy of the shard lives

// Per-mode implementations behind the functions above.
void ddp_init(ParamStore& store);
void* ddp_params_acquire(ParamStore& store, int unit);
float* ddp_grads_acquire(ParamStore& store, int unit);
void ddp_grads_release(ParamStore& store, int unit, bool last_micro_step);
void fsdp_init(ParamStore& store);
void* fsdp_params_acquire(ParamStore& store, int unit);
void fsdp_params_prefetch(ParamStore& store, int unit);
void fsdp_params_release(ParamStore& store, int unit);
float* fsdp_grads_acquire(ParamStore& store, int unit);
void fsdp_grads_release(ParamStore& store, int unit, bool last_micro_step);
