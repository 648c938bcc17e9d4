// checkpoint/async_save.h - asynchronous checkpoints ([checkpoint] async = true): the state is
// copied to host memory at the step boundary and written by a background thread while training
// goes on.
//
// A save of step k:
//   1. at the end of step k (before its step line), every rank copies what it writes - its range
//      of the master weights and both Adam moments, exactly the parts of its rank file
//      (hdf5_format.h: rank_file_contents) - to host memory; rank 0 makes dir/step_k.tmp. The
//      step line shows how long the step waited for this ("ckpt copy 12.3 ms"), which includes
//      the end of a previous save still in flight: one save is in flight at a time.
//   2. a thread per rank builds and writes the rank file from that copy (HDF5 and POSIX only:
//      it touches neither the device nor MPI), freeing each part of the copy once it is in the
//      file; training continues.
//   3. after every later step the ranks agree whether every rank's file is written (one host
//      all-reduce while a save is in flight); once they all are, the save is finished as a
//      synchronous one is (checkpoint/save_phases.h: index, manifest, rename, `latest`, keep).
// The last step, and a preemption, save synchronously, after finishing the one in flight.
// Because the commit is the same, a kill -9 at any moment leaves `latest` naming a complete
// checkpoint (the one before, while a save is in flight) and a *.tmp that the next run removes.
//
// What it costs: host memory for one rank file's worth of state (while its image is built:
// about twice), and the copy. HDF5 is not thread-safe here, so nothing else may use it while a
// save is in flight: a synchronous save or a resume first finishes the one in flight.
#pragma once
#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint/save_phases.h"
#include "parallel/param_store.h"

struct AsyncSave {
  bool in_flight = false;
  SaveTarget target;
  RankFileContents contents;
  std::vector<std::vector<float>> parts;  // the copy, part by part (freed as written)
  std::thread writer;
  std::atomic<bool> written{false};       // set by the writer when its file is done
  std::string problem;                    // the writer's result ("" = written)
  FileDigest digest;
  double copy_s = 0, written_s = 0;
};

// Step 1: copies this rank's state and starts the writer (after finishing a save in flight).
// All ranks call it at the same step. Returns the seconds the step waited.
double async_save_begin(AsyncSave& a, const Config& cfg, int step, const GPTLayout& layout,
                        ParamStore& store, const RunState& run, Mesh& mesh);
// Step 3: after every step, all ranks: finishes the save in flight if every rank's file is
// written (wait = true: waits for this rank's writer first, so the save is always finished).
void async_save_poll(AsyncSave& a, const Config& cfg, const GPTLayout& layout, Comm& world,
                     bool wait);
