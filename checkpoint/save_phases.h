// checkpoint/save_phases.h - the phases of one save (checkpoint/checkpoint.cu), which the
// synchronous save runs back to back and the asynchronous one (checkpoint/async_save.cu)
// spreads over several steps:
//   save_begin    all ranks: rank 0 makes dir/step_N.tmp (agreed)
//   the rank file each rank its own, into save_rank_file(target, rank) (hdf5_format.h)
//   save_finish   all ranks: agree that every rank file was written, gather their digests;
//                 rank 0 writes the index and the manifest, renames, updates `latest` and
//                 removes the checkpoints beyond keep (agreed); rank 0 prints the line
// A failure in any phase stops every rank (checkpoint/checkpoint.h: step 3).
#pragma once
#include <chrono>
#include <string>

#include "checkpoint/files.h"
#include "checkpoint/hdf5_format.h"
#include "config/config.h"
#include "data/dataloader.h"
#include "model/gpt.h"
#include "parallel/mesh.h"

struct SaveTarget {
  int step = 0;
  std::string dir, name, tmp;  // dir, step_000123, dir/step_000123.tmp
  RunState run;                // the data's position and the loss trend after the step
  std::chrono::steady_clock::time_point start;
};

SaveTarget save_begin(const Config& cfg, int step, const RunState& run, Comm& world);
std::string save_rank_file(const SaveTarget& t, int rank);  // its rank file's path
// This rank's place among the writers (hdf5_format.h): writer = world rank.
WriterShards save_writer_shards(Mesh& mesh);
// `problem`: "" or why this rank's file was not written; `digest` its digest; `written_s` the
// seconds from save_begin until the rank files were written; `how` is added to the line
// ("", or how an asynchronous save went).
void save_finish(const Config& cfg, const GPTLayout& layout, const SaveTarget& t, Comm& world,
                 const std::string& problem, const FileDigest& digest, double written_s,
                 const std::string& how);
