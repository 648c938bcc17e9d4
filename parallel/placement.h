// parallel/placement.h - where every parameter tensor lives: the placement map.
//
// A model is described once, as logical tensors ("h.3/attn/qkv/weight", global shape 3C x C).
// A parallel layout decides, per tensor, which block of it a rank holds and who must add up its
// gradient. That decision is data, kept here, so that everything that touches weights - random
// init, llm.c import, the optimizer, the gradient norm, FSDP, checkpoints, exporters - reads the
// placement instead of special-casing a layout:
//
//   TensorPlacement   global shape; the block this rank holds (a list of row ranges x one
//                     column range); whether it is split over tp or replicated; whether the tp
//                     ranks' gradients are partial sums; its offset in the unit's flat buffer
//   ParamUnit         the tensors FSDP gathers together and DDP reduces together (a block, an
//                     MoE block's experts, or the root), with the axis whose group sums the
//                     unit's gradient and shards it under FSDP (dp; dp x cp when cp > 1; for
//                     experts, the ranks that hold the same experts)
//
// Examples, tensor parallel degree t, rank r (parallel/tensor_parallel.cu has the why):
//   qkv weight (3C, C)    three row ranges: rows r*C/t .. of q, of k and of v  (column-parallel;
//                         Llama's ((NH+2NKV)HS, C): three unequal sections, each split alike)
//   fc weight (4C, C)     one row range r*4C/t ..                              (column-parallel)
//   proj weight (C, 4C)   all rows, columns r*4C/t ..                          (row-parallel)
//   wte (Vp, C)           one row range r*Vp/t ..                          (vocabulary-parallel)
//   LayerNorms, wpe,      everything, on every tp rank                             (replicated)
//   row-parallel biases
// Locally a tensor is its row ranges stacked in order, each row holding its column range, row-
// major: the qkv block of rank r is [q_r; k_r; v_r], exactly the packed qkv of its C/t heads.
//
// Inside a unit, tensors are ordered so that three flat ranges say what the store needs:
//   [0, decay_numel)            weight-decayed (2-D) tensors
//   [0, split_numel)            split over tp: every tp rank holds a different block
//   [partial_begin, numel)      replicated over tp, but each tp rank computes only part of the
//                               gradient (sequence parallel: LayerNorms see T/tp tokens), so the
//                               gradients are summed over tp once per step
// Each element is owned by one tp rank (owned_end): the split prefix by the rank holding it, the
// replicated tail by tp rank 0; none of a unit that is a pipeline stage's tied copy. The gradient norm counts, and checkpoint writers write, owned
// elements only, so each logical element once. Shards (FSDP, checkpoint writers) are flat slices of the local unit (see
// shard_range): the one shard geometry of the program.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "parallel/axis.h"

constexpr size_t kTensorAlign = 64;  // elements: every tensor starts 16-byte aligned in any dtype

struct RowRange {
  int64_t first = 0, count = 0;  // global rows [first, first + count)
};

struct TensorPlacement {
  std::string name;       // "wte", "h.3/attn/qkv/weight", "ln_f/bias", ...
  int64_t rows = 0;       // global (logical) shape; a vector has cols == 1
  int64_t cols = 1;
  std::vector<RowRange> row_ranges;  // the global rows held here, stacked in this order
  int64_t col_first = 0;  // the global columns held here: [col_first, col_first + local_cols)
  int64_t local_cols = 1;
  bool tp_split = false;  // the block differs per tp rank (else it is replicated over tp)
  bool grad_partial_over_tp = false;  // tp ranks hold partial gradients: summed over tp
  size_t offset = 0;      // first element in the unit's flat (local) buffer
  bool decay = false;     // AdamW weight decay applies
  float init_std = 0;     // > 0: N(0, init_std) for the global rows below init_rows
  float init_value = 0;   // otherwise this constant (1 for LayerNorm weights)
  int64_t init_rows = 0;  // wte: V; its padded rows start at zero
  // > 1: the logical tensor is `stacked` equal tensors of rows/stacked rows each, one per expert
  // (3-D in checkpoints: (stacked, rows/stacked, cols), or 2-D for a vector); blocks never
  // cross from one to the next (global_blocks cuts them there).
  int64_t stacked = 1;

  int64_t local_rows() const;
  size_t local_numel() const { return (size_t)(local_rows() * local_cols); }
  size_t numel() const { return (size_t)(rows * cols); }  // global
};

struct ParamUnit {
  std::vector<TensorPlacement> tensors;
  size_t numel = 0;          // local flat length, alignment padding included
  size_t decay_numel = 0;    // see the header comment for these three
  size_t split_numel = 0;
  size_t partial_begin = 0;
  Axis grad_axis = Axis::DP; // the group that sums the gradient and that FSDP shards over
  // Pipeline parallelism (parallel/pipeline.cu). The root unit (embeddings, final LayerNorm) is
  // used at both ends of a step, so it is acquired once per step (whole_step). With pp > 1 the
  // first and the last stage each hold the whole root (the tied wte is used by both): its
  // gradients are summed over the embedding group (tied), and the last stage's copy is owned by
  // nobody (tied_copy): the norm and the checkpoints count the first stage's only.
  bool whole_step = false;
  bool tied = false;
  bool tied_copy = false;
  // HSDP ([parallel] dp_replicate = R, parallel/hsdp.cu): the gradient group is R replicas of
  // grad_axis's members / R consecutive ranks; the ZeRO stages shard over those (shard_axis) and
  // the replicas all-reduce the shard (replica_axis). 1: the whole group shards.
  int grad_replicas = 1;
  // Acquired together with the next unit (an MoE block's dense part and its experts, model/gpt.cu):
  // FSDP then keeps one more gathered buffer, so that the next block can still be prefetched.
  bool paired = false;
  // The pipeline stage (model chunk) the unit belongs to: [parallel] bucket_mb's gradient
  // buckets never span two (parallel/grad_buckets.cu), since chunks release in any order.
  int stage = 0;
};
// FSDP's gathered buffers for the non-root units: one in use and one being prefetched, plus one
// when units are acquired in pairs.
int fsdp_pool_slots(const std::vector<ParamUnit>& units);

// HSDP (parallel/hsdp.cu): the group a unit's ZeRO stages shard over and reduce-scatter in -
// grad_axis itself, or its shard sub-group when grad_replicas > 1 - and the group its replicas
// all-reduce the shard over (Axis::Count: none).
Axis shard_axis(const ParamUnit& u);
Axis replica_axis(const ParamUnit& u);

// Building a unit, tensor by tensor (offsets aligned to kTensorAlign). `finish_unit` pads the
// unit and checks the ordering rule above, so a layout that breaks it fails at start-up.
TensorPlacement replicated(const std::string& name, int64_t rows, int64_t cols);
// Rows split over tp: the rows form `parts` equal consecutive parts (qkv: 3), and rank r holds
// the r-th 1/tp of each.
TensorPlacement split_rows(const std::string& name, int64_t rows, int64_t cols, int parts,
                           int tp_rank, int tp);
// The same with unequal consecutive sections (Llama's qkv: [q: NH*HS | k: NKV*HS | v: NKV*HS]
// rows); each section splits over tp, and rank r holds the r-th 1/tp of each, in order.
TensorPlacement split_row_sections(const std::string& name, const std::vector<int64_t>& sections,
                                   int64_t cols, int tp_rank, int tp);
// Columns split over tp: rank r holds columns [r*cols/tp, (r+1)*cols/tp) of every row.
TensorPlacement split_cols(const std::string& name, int64_t rows, int64_t cols, int tp_rank,
                           int tp);
void add_tensor(ParamUnit& u, TensorPlacement t);
void finish_unit(ParamUnit& u);

// ---------------------------------------------------------------------------------------------
// Geometry
// ---------------------------------------------------------------------------------------------
struct FlatRange {
  size_t first = 0, end = 0;  // [first, end) of a flat buffer
  size_t size() const { return end > first ? end - first : 0; }
};
// The shard geometry of FSDP and of checkpoint writers: a unit of `numel` elements is padded to
// a multiple of ranks * kTensorAlign and rank r owns the r-th equal slice. shard_range is that
// slice, unclipped (it may reach into the padding); clip() cuts it to [0, limit).
size_t padded_numel(size_t numel, int ranks);
FlatRange shard_range(size_t numel, int rank, int ranks);
FlatRange clip(FlatRange r, size_t limit);
// The slice of unit u a saver at position `rank` of the `ranks` ranks of u's whole gradient group
// writes (checkpoints: each element once): shard_range over the group, or under HSDP
// (grad_replicas = R) the replica-th of R equal parts of its shard over its block of ranks/R.
FlatRange saver_range(const ParamUnit& u, int rank, int ranks);
// [0, owned_end) of unit u is what tp rank `tp_rank` owns (see the top of this file).
size_t owned_end(const ParamUnit& u, int tp_rank);

// A rows x cols block of a logical tensor, at global (row, col); locally it is contiguous,
// row-major, starting `local` elements into the tensor's local buffer.
struct Block {
  int64_t row = 0, rows = 0, col = 0, cols = 0;
  size_t local = 0;
  size_t numel() const { return (size_t)(rows * cols); }
};
// The global blocks that elements [local_first, local_first + count) of t's local buffer hold,
// in local order: a partial first row, whole rows (cut where the row ranges break), a partial
// last row.
std::vector<Block> global_blocks(const TensorPlacement& t, size_t local_first, size_t count);
// Every block of t that overlaps the unit-flat range r, with `local` made unit-flat.
std::vector<Block> blocks_in_range(const TensorPlacement& t, FlatRange r);

// A source of weights: writes the block b of logical tensor t (b.rows x b.cols floats, row-major)
// to dst. Random init, llm.c import and checkpoint reading are ParamFills, so every layout reads
// exactly the same values (model/init.h, checkpoint/hdf5_format.h).
typedef std::function<void(const TensorPlacement& t, const Block& b, float* dst)> ParamFill;
