// checkpoint/checkpoint.h - saving and resuming training: sharded HDF5 checkpoints that any
// layout can write and any layout can read, written so that a crash never costs the last good one.
//
// What a checkpoint is. A directory [checkpoint] dir/step_000123 holding
//   rank_00000.h5 ... rank_<W-1>.h5   each rank's flat ranges of the fp32 master weights and
//                                     both Adam moments (experts included), each element of the
//                                     model written by exactly one rank; with DiLoCo each
//                                     island's own, and island 0's writers also the outer state
//                                     (the synchronised weights and the outer momentum); with
//                                     compressed reductions also the rank's own error-feedback
//                                     residuals, whole units, read back only by the same rank
//                                     in the same layout (checkpoint/hdf5_format.h)
//   checkpoint.h5                     the index: the step, the resolved config, the seed, the
//                                     data position, the loss's trend, the MoE balancing biases
//                                     (train/moe_bias, fp32, replicated), the model shape, and every
//                                     tensor as a virtual dataset of its logical shape:
//                                     model/wte, model/h.3/attn/qkv/weight, optim/m/...,
//                                     optim/v/... (diloco/... with DiLoCo)
//   data.txt                          the train files it was trained on (checkpoint/data_record.h)
//   manifest.txt                      size and CRC32 of every file above (checkpoint/files.h)
// and dir/latest, a one-line text file naming the newest complete checkpoint.
//
// Why one file per rank plus a virtual-dataset index, not one file written with parallel HDF5:
// - Speed: every rank writes only what it owns, in parallel, with plain POSIX I/O into its own
//   file - no MPI-IO layer, no collective metadata operations (in parallel HDF5 every dataset
//   creation is collective, 3 x 149 of them for GPT-2 124M, each a synchronisation point), no
//   lock contention on one file, and no dependence on the file system's MPI-IO support.
// - Robustness: a rank's failure (disk full) is a failed write of its own file, which it reports
//   and the ranks agree on before anything is committed, instead of a collective call that hangs.
//   HDF5 has no journal: a writer killed mid-write leaves a broken file, so files are only ever
//   written inside a temporary directory that becomes a checkpoint by one rename.
// - Openness: the index makes the directory one ordinary HDF5 file to h5py or h5dump - every
//   tensor whole, under a readable name - with no code of ours: virtual datasets stitch the
//   writers' hyperslabs together (relative source names, resolved beside the index, so the
//   directory can be moved or copied).
// - Layout independence: nothing in the index depends on who wrote it. A reader asks for "rows
//   [a, b) of h.3/attn/qkv/weight" (a ParamFill, parallel/param_store.h: exactly how random init
//   and llm.c import fill a shard) and HDF5 finds which writer files hold them. So any dp, any
//   ZeRO stage (FSDP is 3), optimizer offload or not, any tensor- or expert-parallel degree reads
//   its own hyperslabs and nothing else.
// In replicated mode (DDP) every rank holds everything, but each writes only 1/dp, the slice
// a ZeRO stage would own, so a save is as parallel as in FSDP. The store hands the writer its
// state wherever it lives (store_state_read: device, host memory or the offload file).
//
// Saving (checkpoint_save, all ranks):
//   1. rank 0 creates dir/step_000123.tmp (removing a stale one)                 [barrier]
//   2. each rank builds rank_<r>.h5 in memory (HDF5's core driver) and writes it into the
//      directory with plain POSIX writes, fsyncs it and digests (size, CRC32) what it wrote
//   3. the ranks agree that every write succeeded (otherwise, a full disk say: rank 0 removes
//      the temporary directory and every rank stops with exit status 1, naming the rank, the
//      file and the system's reason; nothing was committed, `latest` still names the previous
//      checkpoint, and no HDF5 file is left half-closed)
//   4. rank 0 writes checkpoint.h5 and then manifest.txt (sizes + CRCs of all files), fsyncs
//      both and the directory, renames step_000123.tmp -> step_000123, fsyncs dir, then replaces
//      `latest` atomically (latest.tmp + fsync + rename + fsync dir), and only then deletes the
//      checkpoints beyond [checkpoint] keep (renamed to *.tmp first, so a half-deleted one never
//      looks like a checkpoint)                                                   [all agree]
// A kill -9 anywhere leaves `latest` naming a complete, fsync'd checkpoint; what is left over is
// a *.tmp directory, removed when the next run starts (checkpoint_resume).
//
// Resuming (checkpoint_resume): resume = "latest" (no checkpoint yet: start from scratch) or a
// path (the directory or its checkpoint.h5). The ranks share the verification: every rank checks
// that every manifest entry exists with its size, and the CRC32 of every world_size-th file; any
// problem stops the job with a message naming the file. A model shape other than the config's
// is refused naming both shapes, and so is a rank file in another rank's place or from another
// step, or a train glob that matches other files than data.txt lists (unless [data]
// allow_changed). Then every rank loads its shard of the master, m and v through
// the index, and the step, seed and data position (data/dataloader.h: epoch, shard, row - global,
// so valid at any dp) are restored. The same layout continues bit for bit: the fp32 master and
// moments are exact, the bf16 working copy is recomputed from the master by the same rounding,
// the Adam step and learning rate are functions of the step, and all randomness (init, data
// order, samples) is a pure function of (seed, step, epoch). Another layout continues within fp32
// reduction-order tolerance (the sums just run in another order).
//
// Limits: the directory must be on a file system all ranks share (rank 0 writes the index over
// every rank's file, and resume reads any rank's file). A save needs room for keep + 1
// checkpoints at once, and host memory of about twice a rank file (its image in HDF5's memory,
// then the copy that is written); on a GPU the device-to-host copies are not overlapped with
// the writes.
#pragma once
#include <string>

#include "checkpoint/async_save.h"
#include "data/data_mix.h"
#include "config/config.h"
#include "model/gpt.h"
#include "parallel/mesh.h"
#include "parallel/param_store.h"

// At start-up, after the store, model and data loaders exist. Removes the temporaries of
// interrupted saves from [checkpoint] dir; then, if [checkpoint] resume names a checkpoint,
// verifies it and loads it: the store's master, m and v, the train datasets' positions, the loss's
// trend, the MoE balancing biases (empty if it has none), and the seed (cfg.train.seed becomes the checkpoint's). Returns the number of steps already done
// (0 for a fresh start). Any problem stops the job with a message naming the file.
int checkpoint_resume(Config& cfg, const GPTLayout& layout, ParamStore& store,
                      DataMix& train_data, LossTrend* loss_trend,
                      std::vector<float>* moe_bias, Mesh& mesh);

// A save is due after step `step` when [checkpoint] dir is set and the step is a multiple of
// [checkpoint] every, or the last.
bool checkpoint_due(const Config& cfg, int step);
// Right after the step's update, before its step line, all ranks: with [checkpoint] async, begins
// an asynchronous save of a due step other than the last (checkpoint/async_save.h). Returns the
// seconds the step waited for it, or -1 when no save began.
double checkpoint_snapshot_if_due(AsyncSave& async, const Config& cfg, int step,
                                  const GPTLayout& layout, ParamStore& store, const RunState& run,
                                  Mesh& mesh);
// After the step's logs, evaluation and preemption agreement, all ranks: finishes an
// asynchronous save whose files every rank has written (all of it at the last step or `now`),
// then saves synchronously when a save is due and was not begun asynchronously, or `now` (a
// preemption: training/preemption.h). Returns whether it saved this step.
bool checkpoint_after_step(AsyncSave& async, const Config& cfg, int step, const GPTLayout& layout,
                           ParamStore& store, const RunState& run, Mesh& mesh, bool now);

// Saves unconditionally into cfg.checkpoint.dir (the protocol above).
void checkpoint_save(const Config& cfg, int step, const GPTLayout& layout, ParamStore& store,
                     const RunState& run, Mesh& mesh);
