// checkpoint/hdf5_format.h - what a checkpoint looks like on disk, in HDF5: one file per writer
// rank holding the flat ranges it owns, and an index file whose virtual datasets present every
// logical tensor whole. The why is in checkpoint/checkpoint.h; this is the how.
//
// Writer geometry. Of W writers (the dp ranks), writer w saves elements [w*P/W, (w+1)*P/W) of
// every unit's flat buffer (model/gpt.h), P = the unit's length rounded up to W * kTensorAlign,
// clipped to the unit's real length: FSDP's own shard geometry (parallel/param_store.cu), so an
// FSDP rank writes exactly what it holds, and a replicated (DDP) rank writes the same slice of its
// full copy - the writing is split evenly either way.
//
// rank_00003.h5 (writer 3), one 1-D float32 dataset per state and unit, attribute `first`:
//   /model/unit_0, /model/unit_1, ..., /optim/m/unit_0, ..., /optim/v/unit_0, ...
// checkpoint.h5 (the index, written by rank 0):
//   attributes   format_version, step, writers, n_layer, n_head, d_model, seq_len, vocab_size,
//                padded_vocab
//   /config      the resolved config as TOML (a string dataset: no 64 KiB attribute limit)
//   /rng         attribute seed: all randomness is a pure function of (seed, step, epoch)
//   /data        attributes epoch, shard, row: the train loader's layout-independent position
//   /model/<tensor>, /optim/m/<tensor>, /optim/v/<tensor>   e.g. /model/h.3/attn/qkv/weight
//                virtual datasets of the logical shape ((rows, cols), or (rows,) for vectors)
// A writer's slice of a 2-D tensor is a flat range, which is not one hyperslab; it maps as up to
// three: the partial first row, the full rows, the partial last row (flat_range_pieces). The
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

struct FlatRange {
  size_t first = 0, end = 0;  // [first, end) of a unit's flat buffer
  size_t size() const { return end > first ? end - first : 0; }
};
FlatRange writer_range(size_t unit_numel, int writer, int writers);

// A rows x cols block at (row, col) of a matrix with `width` columns; `flat` = row*width + col.
struct RowPiece {
  size_t row, col, rows, cols, flat;
};
std::vector<RowPiece> flat_range_pieces(size_t first, size_t count, size_t width);

// Everything but the tensors.
struct CheckpointMeta {
  int format_version = kCheckpointFormatVersion;
  int64_t step = 0;
  uint64_t seed = 0;
  DataPosition data;
  std::string config_toml;
  int writers = 0;
  int L = 0, NH = 0, C = 0, T = 0, V = 0, Vp = 0;  // the model's shape
};

// Writes this writer's ranges of the master, m and v of every unit (copied from the device).
// The store's compute stream must be idle. Returns "" or a message naming the file.
std::string h5_write_rank_file(const std::string& path, ParamStore& store,
                               const GPTLayout& layout, int writer, int writers);
// Writes the index. Returns "" or a message naming the file.
std::string h5_write_index(const std::string& path, const GPTLayout& layout,
                           const CheckpointMeta& meta);

// Reading, any layout: the index opened read-only, and a ParamFill per state that reads the
// requested flat range of a logical tensor as up to three hyperslabs.
struct CheckpointIndex {
  int64_t file = -1;  // hid_t
  std::string path;
};
// Opens the index and reads its metadata. Returns "" or a message naming the file.
std::string h5_open_index(const std::string& path, CheckpointIndex* index, CheckpointMeta* meta);
void h5_close_index(CheckpointIndex& index);
// Exits naming the file and tensor if a tensor is missing or has another shape.
ParamFill h5_index_fill(const CheckpointIndex& index, StateKind kind);
