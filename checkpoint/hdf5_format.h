// checkpoint/hdf5_format.h - what a checkpoint looks like on disk, in HDF5: one file per writer
// rank holding the flat ranges it owns, and an index file whose virtual datasets present every
// logical tensor whole. The why is in checkpoint/checkpoint.h; this is the how.
//
// Writer geometry. Every rank writes; writer w is world rank
// w = ((dp_rank * pp + pp_rank) * cp + cp_rank) * tp + tp_rank. It saves, of each of its (tp-,
// pp- and ep-local) units, the slice that FSDP gives it over the ranks holding the same unit
// (shard_range, parallel/placement.h), so an FSDP rank writes exactly what it holds and a
// replicated (DDP) rank writes the same slice of its full copy:
//   dense units (grad_axis DP or DPCP)  slice dpcp_index of dp * cp, dpcp_index = dp_rank * cp +
//                                       cp_rank: every rank of dp x cp holds them
//   expert units (grad_axis EPDP)       slice dpcp_index / ep of dp * cp / ep: only the ranks
//                                       with ep_rank = dpcp_index % ep hold these experts
// (under HSDP, dp_replicate = R, the slice is saver_range's, parallel/hsdp.cu: a replica's
// part of its shard over 1/R of those ranks, so that it lies inside what the rank holds)
// but the tail of a unit that is replicated over tp (the norms, GPT-2's wpe and row-parallel
// biases, the routers and every expert tensor) only from tp rank 0, and nothing of the last
// pipeline stage's copy of the root (the first stage's is saved): every element of every
// logical tensor is written exactly once (h5_write_index checks the count of each tensor).
//
// DiLoCo islands ([parallel] diloco_islands = K, parallel/diloco.h) hold K different states: dp x
// cp above is then the writer's island's (dp/K dp ranks), each island writes its own master and
// moments, and island 0 also writes the outer state (diloco/sync, diloco/m: the same in every
// island), so that each element of each island's tensors is written exactly once.
//
// rank_00003.h5 (writer 3), attributes writer (3: its world rank) and step (the checkpoint's;
// both absent in older checkpoints) and its place: shard_rank, tp_rank, pp_rank, ep_rank; one
// 1-D float32 dataset per state and unit, attribute `first`:
//   /model/unit_0, /model/unit_1, ..., /optim/m/unit_0, ..., /optim/v/unit_0, ...
//   (with DiLoCo, island 0's writers also /diloco/sync/unit_0, ..., /diloco/m/unit_0, ...;
//   with compressed reductions every writer also its /residual/... : residual_layout below)
// checkpoint.h5 (the index, written by rank 0):
//   attributes   format_version, step, writers, writer_tp, writer_cp, writer_pp, writer_pp_virtual,
//                writer_ep, diloco_islands (only with DiLoCo: K), writer_dp_replicate (only
//                with HSDP: R, parallel/hsdp.cu saver_range), n_layer, n_head, d_model,
//                seq_len, vocab_size, padded_vocab,
//                max_seq_len (wpe's rows), n_experts, d_expert, moe_every (0, 0, 0: dense),
//                writer_pp_order (0: loop, 1: V), writer_pp_layers (each stage's blocks, only
//                when not equal); a Llama's llama = 1, n_kv_head, d_ff, tie_embeddings. Absent in older checkpoints: max_seq_len = seq_len,
//                writer_ep = 1, dense, loop order, equal stages.
//   /config      the resolved config as TOML (a string dataset: no 64 KiB attribute limit)
//   /rng         attribute seed: all randomness is a pure function of (seed, step, epoch)
//   /data        attributes epoch, shard, row: the train loader's layout-independent position
//                (of the first dataset; with several, data.txt holds them all: data_record.h)
//   /train       attributes loss_mean, loss_var (float64), applied, skipped, skipped_in_a_row:
//                the loss's trend (training/health.h). Absent in older checkpoints: a fresh trend.
//                With [train] moe_balance = "bias" also moe_bias (fp32, L x E): the MoE
//                balancing biases, replicated (every layout reads them whole)
//   /model/<tensor>, /optim/m/<tensor>, /optim/v/<tensor>   e.g. /model/h.3/attn/qkv/weight
//                virtual datasets of the logical shape: (rows, cols), or (rows,) for vectors;
//                a stacked tensor (TensorPlacement::stacked = E, the experts of an MoE block)
//                has a leading experts axis: (E, rows/E, cols), or (E, rows/E). With DiLoCo
//                these are island 0's, island k's (k >= 1) are /diloco/island_<k>/model/...,
//                /diloco/island_<k>/optim/m/..., /diloco/island_<k>/optim/v/...
//   /diloco/sync/<tensor>, /diloco/m/<tensor>   with DiLoCo: the weights of the last outer step
//                and the outer momentum, of the same shapes
// A writer's slice of a tensor is a flat range of its local block, which is not one hyperslab of
// the logical tensor; it maps as the global blocks of parallel/placement.h (global_blocks): a
// partial first row, whole rows cut where the tp row ranges or the experts break, a partial
// last row. Global row g of a stacked tensor is row g % (rows/E) of expert g / (rows/E); a block
// never crosses experts, so each block is one hyperslab. The virtual datasets' fill value is
// NaN, so a source file gone missing shows as NaN in h5py rather than as plausible zeros
// (resume checks every file against the manifest before reading).
//
// Versions. 1: dense models. 2: a model with experts (3-D datasets, the MoE attributes), which a
// version-1 reader must refuse rather than look for the dense MLP. A dense model is still
// written as version 1, so older readers keep reading it; this one reads both.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "checkpoint/files.h"
#include "data/data_mix.h"
#include "data/dataloader.h"
#include "training/health.h"
#include "model/gpt.h"
#include "parallel/param_store.h"

constexpr int kCheckpointFormatDense = 1;  // the version written for a dense model
constexpr int kCheckpointFormatMoe = 2;    // ... for a model with experts; the newest one read
extern const char* const kIndexFileName;  // "checkpoint.h5"
std::string rank_file_name(int writer);   // "rank_00003.h5"

// A writer's place in dp x cp (its DiLoCo island's, with islands): its index there
// (dp_rank_in_island * cp + cp_rank), their number (dp/K * cp), and the expert-parallel degree
// that groups them (ep_rank = index % ep); and its island (0 without DiLoCo).
struct WriterShards {
  int index = 0, count = 1, ep = 1;
  int island = 0;
};
// Where island k's master and moments are in the index: "" for island 0, else
// "diloco/island_<k>/".
std::string island_prefix(int island);
// The range of unit `u` (this writer's local layout) that a writer saves: its slice over the
// ranks holding the unit (the writer geometry above), clipped to what its tp rank owns.
FlatRange writer_range(const ParamUnit& u, const WriterShards& s, int tp_rank);

// What a checkpoint keeps of the run besides the tensors and the config: where the training data
// is, and the loss's trend (training/health.h: skipped spikes), as they were after its step.
struct RunState {
  DataPosition data;  // the first dataset's position (the index's /data)
  LossTrend loss_trend;
  DataMixState mix;   // every dataset's (data.txt, with several: checkpoint/data_record.h)
  std::vector<float> moe_bias;  // the MoE balancing biases (L x E, model/moe.h); empty: none
};

// Everything but the tensors.
struct CheckpointMeta {
  int format_version = kCheckpointFormatDense;
  int64_t step = 0;
  uint64_t seed = 0;
  DataPosition data;
  LossTrend loss_trend;
  std::vector<float> moe_bias;  // train/moe_bias: absent without bias balancing (and in older ones)
  std::string config_toml;  // written for people and tools (h5py); resume does not read it
  int writers = 0;        // dp * pp * cp * tp
  int writer_tp = 1;      // the tp degree of the layout that wrote it
  int writer_cp = 1;      // its context-parallel degree
  int writer_pp = 1;      // its pipeline degree and chunks per pipeline rank
  int writer_pp_virtual = 1;
  int writer_pp_order = 0;  // its stage order: 0 loop, 1 V (parallel/pipeline_schedule.h)
  std::vector<int> writer_pp_layers;  // its stages' block counts; empty: equal stages
  int writer_ep = 1;      // its expert-parallel degree
  int islands = 0;        // its [parallel] diloco_islands (0: no DiLoCo)
  int writer_dp_replicate = 1;  // its [parallel] dp_replicate (HSDP: how the savers cut shards)
  int L = 0, NH = 0, C = 0, T = 0, V = 0, Vp = 0;  // the model's shape (T: trained at)
  int maxT = 0;                                    // wpe's rows, max_seq_len
  int E = 0, d_expert = 0, moe_every = 0;          // mixture of experts; 0, 0, 0: dense
  int n_shared = 0;  // an MoE block's shared experts (attribute n_shared_experts, written if > 0)
  // The architecture: llama 1 (attributes llama, n_kv_head, d_ff, tie_embeddings, written only
  // for a Llama), or GPT-2 (absent: llama 0, n_kv_head = n_head, d_ff = 4 d_model, tied).
  int llama = 0, NKV = 0, F = 0, tied = 1;
};

// What a writer saves: its range of the master, m and v of every unit (writer_range), and with
// DiLoCo in island 0 of the outer state too; the parts of its rank file in order, and the
// attributes naming its place.
struct RankFilePart {
  StateKind kind;
  int unit;
  FlatRange range;
};
// With compressed reductions the file also holds this rank's residuals (below): whole units,
// after the parts. "Items" are the parts, then the residuals, in that order.
struct RankFileResidual {
  int unit;
  size_t numel;
  bool outer = false;  // DiLoCo's outer residual (ParamStore::outer), else the gradient's
};
// Whether the store holds residuals of compressed reductions (gradients or DiLoCo's meetings).
bool store_has_residuals(const ParamStore& store);
struct RankFileContents {
  int64_t writer = -1, step = -1;  // its world rank and the checkpoint's step (-1: not written)
  int64_t shard_rank = 0, tp_rank = 0, pp_rank = 0, ep_rank = 0;
  std::vector<RankFilePart> parts;  // the non-empty ranges, by state then unit
  std::string residual_layout;      // residual_layout(); "" without compression
  std::vector<RankFileResidual> residuals;
  size_t items() const { return parts.size() + residuals.size(); }
  size_t item_floats(size_t i) const;
  size_t floats() const;            // the total size of the items
};
RankFileContents rank_file_contents(const GPTLayout& layout, const WriterShards& shards,
                                    const ParamStore& store, const MeshShape& shape);
// The host data of item i: called once per item, in order; the pointer is read before the
// next call (the synchronous save copies each part from the device into one buffer, the
// asynchronous one hands out its snapshot, checkpoint/async_save.cu).
using PartSource = std::function<const float*(size_t i)>;
// The store's slice of part p on the host: copied from the device (the store's compute stream
// must be idle). Exits naming the unit if the range is not inside the rank's shard.
void copy_part(ParamStore& store, const RankFilePart& p, float* dst);
// Item i of the contents on the host: a part (copy_part) or a residual (copied from the device).
void copy_item(ParamStore& store, const RankFileContents& c, size_t i, float* dst);
// Writes the rank file: built in memory by HDF5 (its core driver), then written, fsync'd and
// digested with plain POSIX calls (checkpoint/files.h), so a full disk is one clean write error
// naming the file and HDF5 never holds a file it could not close. Returns "" or the problem.
std::string h5_write_rank_file(const std::string& path, const RankFileContents& contents,
                               const PartSource& source, FileDigest* digest);
// The synchronous case: every item copied from the store; `writer` and `step` as above.
std::string h5_write_rank_file(const std::string& path, ParamStore& store,
                               const GPTLayout& layout, const WriterShards& shards,
                               const MeshShape& shape, FileDigest* digest, int64_t writer = -1,
                               int64_t step = -1);

// The residuals of the compressed reductions ([parallel] grad_compression, parallel/
// grad_compression.cu, and diloco_compression, parallel/diloco.h) are this rank's own state, not
// part of any logical tensor, so they stay out of the index: the rank file holds
// /residual/unit_<u> (the whole gradient residual of unit u), /residual/diloco_unit_<u> (the
// whole outer residual of unit u's shard) and the string /residual/layout, which names
// everything their meaning depends on (the compressions, the degrees, the ZeRO stage, the
// islands, and under pp which blocks this rank's stages hold: residual_layout). A run resumes
// them only from the file of its own world rank written under the same layout; otherwise they
// are dropped (zero: the steps before lose what they had not sent yet, nothing else changes).
// Sequence parallelism is not part of it: the residuals keep their meaning either way (the
// compressed reductions sum over tp after the dp reduction, parallel/grad_compression.cu).
std::string residual_layout(const ParamStore& store, const GPTLayout& layout,
                            const MeshShape& shape);
// Loads this rank's residuals from `rank_file` if it holds them under `layout`. Returns "" when
// loaded, else why not (the caller warns). A broken file stops the job naming it.
std::string h5_read_residuals(const std::string& rank_file, ParamStore& store,
                              const std::string& layout);
// The writers' degrees (their dp, pp, cp, tp, ep and chunks per pipeline rank; sp changes no
// layout), as the index records them.
MeshShape writer_shape(const CheckpointMeta& meta);
// The units of every (pp, tp, ep) rank of a layout of the writers' degrees (dp and cp ranks do not
// change a layout), which the index maps the writers' files with:
// units[(pp_rank * tp + tp_rank) * ep + ep_rank].
using WriterUnits = std::vector<std::vector<ParamUnit>>;
WriterUnits writer_units(const ModelConfig& model, const MeshShape& writers);
// Writes the index over the files of meta.writers writers (in memory, then as the rank file);
// `units` as writer_units gives them. Returns "" or a message naming the file (or the tensor
// whose elements the writers do not hold exactly once).
std::string h5_write_index(const std::string& path, const WriterUnits& units,
                           const CheckpointMeta& meta, FileDigest* digest);

// Reading, any layout: the index opened read-only, and a ParamFill per state that reads the
// requested block of a logical tensor as one hyperslab (`prefix`: island_prefix).
struct CheckpointIndex {
  int64_t file = -1;  // hid_t
  std::string path;
};
// Opens the index and reads its metadata. Returns "" or a message naming the file.
std::string h5_open_index(const std::string& path, CheckpointIndex* index, CheckpointMeta* meta);
void h5_close_index(CheckpointIndex& index);
// Each rank file w of the checkpoint directory `ckpt` (with w % stride == offset, so the ranks
// share the reading) carries writer = w and step = meta.step, and the index's step is the one
// the directory's name (step_000123) says: a file swapped with another rank's or copied from
// another checkpoint is refused, naming the file, who wrote it and where it sits (a file without
// the attributes, from an older trainer, is not checked). Returns "" or the problem.
std::string h5_check_rank_files(const std::string& ckpt, const CheckpointMeta& meta, int offset,
                                int stride);
// Exits naming the file and tensor if a tensor is missing or has another shape.
ParamFill h5_index_fill(const CheckpointIndex& index, StateKind kind,
                        const std::string& prefix = "");
