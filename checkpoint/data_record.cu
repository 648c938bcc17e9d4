// checkpoint/data_record.cu - data.txt of a checkpoint (checkpoint/data_record.h).
#include "checkpoint/data_record.h"

#include <cstdio>
#include <vector>

#include "data/data_manifest.h"
#include "kernels/common.h"

namespace {
std::vector<ShardRecord>& run_shards() {  // the train glob's files of this run (rank 0)
  static std::vector<ShardRecord> shards;
  return shards;
}
}  // namespace

void data_record_set(const DataLoader& train, Comm& world) {
  std::string problem;
  if (world.rank == 0) problem = data_manifest_of(train, &run_shards());
  if (all_agree(world, problem.empty())) return;
  for (const std::string& p : all_gather_strings(world, problem))  // rank 0's message
    if (!p.empty()) FATAL_ALL("%s: %s", train.what.c_str(), p.c_str());
}

std::string data_record_write(const std::string& dir, ManifestEntry* entry) {
  const std::string text = data_manifest_text(run_shards());
  entry->file = kDataRecordName;
  entry->digest.bytes = text.size();
  entry->digest.crc32 = crc32_update(0, text.data(), text.size());
  return write_file_synced(dir + "/" + kDataRecordName, text);
}

// Rank 0: "" or the refusal; *pos mapped when the set changed and that is allowed.
static std::string compare(const std::string& ckpt, bool allow_changed, const DataLoader& train,
                           DataPosition* pos) {
  const std::string path = ckpt + "/" + kDataRecordName;
  std::string text;
  if (!read_text_file(path, &text)) {
    std::printf("resume   note: %s has no %s (written by an older trainer): the train files "
                "are not compared with the ones it was trained on\n", ckpt.c_str(),
                kDataRecordName);
    return "";
  }
  std::vector<ShardRecord> saved;
  std::string problem = data_manifest_parse(text, path, &saved);
  if (!problem.empty()) return problem;
  const std::string diff = data_manifest_diff(saved, run_shards());
  if (diff.empty()) return "";
  if (!allow_changed)
    return train.what + " matches other files than " + ckpt +
           " was trained on:" + diff + "\nits data position would point at other rows. Restore "
           "the files, or set [data] allow_changed = true to continue on the new set (the "
           "position is mapped and printed)";
  std::string how;
  *pos = data_position_map(train, saved, *pos, &how);
  std::printf("resume   [data] allow_changed: the train files differ from the checkpoint's:%s\n"
              "resume   data position %s\n", diff.c_str(), how.c_str());
  return "";
}

std::string data_record_resume(const std::string& ckpt, bool allow_changed,
                               const DataLoader& train, DataPosition* pos, Comm& world) {
  std::string problem;
  if (world.rank == 0) problem = compare(ckpt, allow_changed, train, pos);
  const int64_t mine[3] = {pos->epoch, pos->shard, pos->row};
  std::vector<int64_t> all(3 * (size_t)world.size);
  all_gather_host(world, mine, sizeof(mine), all.data());
  *pos = DataPosition{all[0], all[1], all[2]};  // rank 0's
  return problem;
}
