// checkpoint/hdf5_format.h - what a checkpoint looks like on disk, in HDF5: one file per writer
// rank holding the flat ranges it owns, and an index file whose virtual datasets present every
// logical tensor whole. The why is in checkpoint/checkpoint.h; this is the how.
//
// Writer geometry. Every rank writes; writer w is world rank
// w = ((dp_rank * pp + pp_rank) * cp + cp_rank) * tp + tp_rank. It saves its slice of each of its
// (tp- and pp-local) units over the dp x cp ranks that hold the same units (slice
// dp_rank * cp + cp_rank of dp * cp) - FSDP's own shard geometry (shard_range,
// parallel/placement.h), so an FSDP rank writes exactly what it holds and a replicated (DDP)
// rank writes the same slice of its full copy - but the tail of a unit that is replicated over
// tp (LayerNorms, wpe, row-parallel biases) only from tp rank 0, and nothing
// of the last pipeline stage's copy of the root (the first stage's is saved): every element of
// every logical tensor is written exactly once.
//
// rank_00003.h5 (writer 3), one 1-D float32 dataset per state and unit, attribute `first`:
//   /model/unit_0, /model/unit_1, ..., /optim/m/unit_0, ..., /optim/v/unit_0, ...
// checkpoint.h5 (the index, written by rank 0):
//   attributes   format_version, step, writers, writer_tp, writer_cp, writer_pp, writer_pp_virtual,
//                n_layer, n_head, d_model, seq_len, vocab_size, padded_vocab, max_seq_len (wpe's
//                rows; absent in older checkpoints: = seq_len)
//   /config      the resolved config as TOML (a string dataset: no 64 KiB attribute limit)
//   /rng         attribute seed: all randomness is a pure function of (seed, step, epoch)
//   /data        attributes epoch, shard, row: the train loader's layout-independent position
//   /model/<tensor>, /optim/m/<tensor>, /optim/v/<tensor>   e.g. /model/h.3/attn/qkv/weight
//                virtual datasets of the logical shape ((rows, cols), or (rows,) for vectors)
// A writer's slice of a tensor is a flat range of its local block, which is not one hyperslab of
// the logical tensor; it maps as the global blocks of parallel/placement.h (global_blocks): a
// partial first row, whole rows cut where the tp row ranges break, a partial last row. The
// virtual datasets' fill value is NaN, so a source file gone missing shows as NaN in h5py rather
// than as plausible zeros (resume checks every file against the manifest before reading).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/dataloader.h"
#include "model/gpt.h"
#include "parallel/param_store.h"

constexpr int kCheckpointFormatVersion = 1;
extern const char* const kIndexFileName;  // "checkpoint.h5"
std::string rank_file_name(int writer);   // "rank_00003.h5"

// The range of unit `u` (this writer's local layout) that a writer saves: slice shard_rank of
// `shards` (its dp x cp index), clipped to what its tp rank owns.
FlatRange writer_range(const ParamUnit& u, int shard_rank, int shards, int tp_rank);

// Everything but the tensors.
struct CheckpointMeta {
  int format_version = kCheckpointFormatVersion;
  int64_t step = 0;
  uint64_t seed = 0;
  DataPosition data;
  std::string config_toml;
  int writers = 0;        // dp * pp * cp * tp
  int writer_tp = 1;      // the tp degree of the layout that wrote it
  int writer_cp = 1;      // its context-parallel degree
  int writer_pp = 1;      // its pipeline degree and chunks per pipeline rank
  int writer_pp_virtual = 1;
  int L = 0, NH = 0, C = 0, T = 0, V = 0, Vp = 0;  // the model's shape (T: trained at)
  int maxT = 0;                                    // wpe's rows, max_seq_len
};

// Writes this writer's ranges of the master, m and v of every unit (copied from the device).
// The store's compute stream must be idle. Returns "" or a message naming the file.
std::string h5_write_rank_file(const std::string& path, ParamStore& store,
                               const GPTLayout& layout, int shard_rank, int shards);
// Writes the index; layouts[pp_rank * writer_tp + tp_rank] is the layout of that (pp, tp) rank
// (writer_pp * writer_tp of them; dp does not change a layout). Returns "" or a message naming
// the file.
std::string h5_write_index(const std::string& path, const std::vector<GPTLayout>& layouts,
                           const CheckpointMeta& meta);

// Reading, any layout: the index opened read-only, and a ParamFill per state that reads the
// requested block of a logical tensor as one hyperslab.
struct CheckpointIndex {
  int64_t file = -1;  // hid_t
  std::string path;
};
// Opens the index and reads its metadata. Returns "" or a message naming the file.
std::string h5_open_index(const std::string& path, CheckpointIndex* index, CheckpointMeta* meta);
void h5_close_index(CheckpointIndex& index);
// Exits naming the file and tensor if a tensor is missing or has another shape.
ParamFill h5_index_fill(const CheckpointIndex& index, StateKind kind);
