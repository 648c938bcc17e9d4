// data/data_manifest.h - which shard files a run trains on, as part of its identity: a
// checkpoint records them, and a resume on another set is refused (or, when allowed, says how
// its data position maps onto the new set).
//
// Why. The data position a checkpoint keeps (epoch, shard, row: data/dataloader.h) is an index
// into the glob's matches and, shuffled, into a permutation of their count. A shard added to or
// removed from the glob, or rewritten, silently moves every later batch to other rows: a resumed
// run diverges from the uninterrupted one with no word.
//
// What is recorded, per matched file in glob order: its path as matched, its size in bytes, its
// token count and token width (2: uint16, 4: uint32, from its header), and a cheap content
// hash, FNV-1a 64 of its first 8 KiB (the 1024-byte header and the first tokens): enough to
// notice a rewritten or replaced shard, read in microseconds even for thousands of shards.
//
// The text form (data.txt in a checkpoint directory, listed in its manifest.txt; a line must
// have bytes = 1024 + tokens x token bytes, tokens < 2^31, as a shard's header allows):
//   # data manifest, format 1: <bytes> <tokens> <token bytes> <fnv1a64 of the first 8 KiB> <path>
//   1282024 640500 2 9ae16a3b2f90be72 data/train_000.bin
//   ...
//   end <the number of files>
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/dataloader.h"

struct ShardRecord {
  std::string path;
  int64_t bytes = 0, tokens = 0;
  int token_bytes = 0;
  uint64_t head_hash = 0;
};

// The records of the loader's files (hashing each file's first 8 KiB). "" or the problem.
std::string data_manifest_of(const DataLoader& dl, std::vector<ShardRecord>* out);
std::string data_manifest_text(const std::vector<ShardRecord>& shards);
// Parses the text form; "" or what is wrong (naming `source` and the line).
std::string data_manifest_parse(const std::string& text, const std::string& source,
                                std::vector<ShardRecord>* out);
// What differs between the set a checkpoint was written with and the current one, one line per
// file ("added", "removed", "changed: ..."); "" when they are the same.
std::string data_manifest_diff(const std::vector<ShardRecord>& saved,
                               const std::vector<ShardRecord>& now);
// With a changed set allowed: the position of `saved` (a position over the saved set, shuffled
// or not with the loader's seed) carried onto the loader's set - the same epoch, the file that
// was being read if it is still there (at the same row when it still has it), else the same shard
// index (clamped: past the last shard the next epoch starts). `how` says what happened.
DataPosition data_position_map(const DataLoader& now, const std::vector<ShardRecord>& saved,
                               const DataPosition& pos, std::string* how);
