// checkpoint/data_record.h - the training data as part of a checkpoint: data.txt, the train
// glob's files as they were when it was saved (data/data_manifest.h), written by rank 0 next to
// the index and listed in manifest.txt; and on resume the comparison with the files the glob
// matches now.
//
// A different set (a file added, removed, rewritten, or in another format) stops the resume,
// naming each difference, unless [data] allow_changed = true: then the run continues, printing
// how its data position maps onto the new set (data_position_map). A checkpoint from before
// data.txt resumes with a note. Only rank 0 reads the shards' heads and compares (every rank
// sees the same files; the ranks agree on the verdict and rank 0's position is shared).
#pragma once
#include <string>

#include "checkpoint/files.h"
#include "data/dataloader.h"
#include "parallel/comm.h"

constexpr const char* kDataRecordName = "data.txt";

// At start-up (checkpoint_resume), every rank: remembers the train loader's files for the saves
// of this run (rank 0 reads their heads). Stops the job if a shard cannot be read.
void data_record_set(const DataLoader& train, Comm& world);
// Rank 0, while committing a save: writes data.txt into the save's directory and gives its
// manifest entry. Returns "" or the problem.
std::string data_record_write(const std::string& dir, ManifestEntry* entry);
// Every rank, on resume: compares ckpt's data.txt with the remembered set; `pos` (the
// checkpoint's data position) becomes rank 0's mapped one. Returns "" or (on rank 0) why the
// resume is refused; the caller makes the ranks agree.
std::string data_record_resume(const std::string& ckpt, bool allow_changed,
                               const DataLoader& train, DataPosition* pos, Comm& world);
