// checkpoint/data_record.h - the training data as part of a checkpoint: data.txt, the train
// datasets' files as they were when it was saved (data/data_manifest.h), written by rank 0 next
// to the index and listed in manifest.txt; and on resume the comparison with the files the globs
// match now.
//
// One dataset ([data] train a glob): data.txt is the data manifest of its files, and its
// position is the index's /data. Several (data/data_mix.h): data.txt is the mix record - per
// dataset its weight, position, rows drawn, glob and data manifest, and the rows drawn in all -
// and resume restores every dataset's position and count from it.
//
// A different set (a file added, removed, rewritten, or in another format) stops the resume,
// naming each difference (and the dataset), unless [data] allow_changed = true: then the run
// continues, printing how the position of each changed dataset maps onto its new set
// (data_position_map). Another number of datasets than the checkpoint's is refused; other weights
// are noted (the draws from the next row on use them). A checkpoint from before data.txt resumes
// with a note. Only rank 0 reads the shards' heads and compares (every rank sees the same files;
// the ranks agree on the verdict and rank 0's state is shared).
#pragma once
#include <string>

#include "checkpoint/files.h"
#include "data/data_mix.h"
#include "parallel/comm.h"

constexpr const char* kDataRecordName = "data.txt";

// At start-up (checkpoint_resume), every rank: remembers the train datasets' files for the saves
// of this run (rank 0 reads their heads). Stops the job if a shard cannot be read.
void data_record_set(const DataMix& train, Comm& world);
// Rank 0, while committing a save: writes data.txt (with `state`, the datasets' state after the
// saved step, when there are several) into the save's directory and gives its manifest entry.
// Returns "" or the problem.
std::string data_record_write(const std::string& dir, const DataMixState& state,
                              ManifestEntry* entry);
// Every rank, on resume: compares ckpt's data.txt with the remembered sets; `state` (in: the
// first dataset's position from the index) becomes rank 0's, read from data.txt with several
// datasets and mapped where a set changed. Returns "" or (on rank 0) why the resume is refused;
// the caller makes the ranks agree.
std::string data_record_resume(const std::string& ckpt, bool allow_changed,
                               const DataMix& train, DataMixState* state, Comm& world);
