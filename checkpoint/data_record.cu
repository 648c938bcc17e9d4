// checkpoint/data_record.cu - data.txt of a checkpoint (checkpoint/data_record.h).
#include "checkpoint/data_record.h"

#include <cstdio>
#include <vector>

#include "data/data_manifest.h"
#include "kernels/common.h"

namespace {
MixRecord& run_record() {  // the train datasets of this run (rank 0): globs, weights, files
  static MixRecord record;
  return record;
}
}  // namespace

void data_record_set(const DataMix& train, Comm& world) {
  std::string problem;
  MixRecord& r = run_record();
  r = MixRecord();
  r.patterns = train.patterns;
  r.weights = train.weights;
  r.shards.resize(train.sources.size());
  for (size_t k = 0; k < train.sources.size() && world.rank == 0 && problem.empty(); k++)
    problem = data_manifest_of(train.sources[k], &r.shards[k]);
  if (all_agree(world, problem.empty())) return;
  for (const std::string& p : all_gather_strings(world, problem))  // rank 0's message
    if (!p.empty()) FATAL_ALL("%s: %s", train.what.c_str(), p.c_str());
}

std::string data_record_write(const std::string& dir, const DataMixState& state,
                              ManifestEntry* entry) {
  MixRecord record = run_record();
  record.state = state;
  const std::string text = record.shards.size() == 1 ? data_manifest_text(record.shards[0])
                                                      : data_mix_record_text(record);
  entry->file = kDataRecordName;
  entry->digest.bytes = text.size();
  entry->digest.crc32 = crc32_update(0, text.data(), text.size());
  return write_file_synced(dir + "/" + kDataRecordName, text);
}

// Dataset k's saved files against the current ones: "" or the refusal; *pos mapped when the set
// changed and that is allowed.
static std::string compare_files(const std::string& ckpt, bool allow_changed,
                                 const DataLoader& now, const std::vector<ShardRecord>& saved,
                                 const std::vector<ShardRecord>& current, DataPosition* pos) {
  const std::string diff = data_manifest_diff(saved, current);
  if (diff.empty()) return "";
  if (!allow_changed)
    return now.what + " matches other files than " + ckpt +
           " was trained on:" + diff + "\nits data position would point at other rows. Restore "
           "the files, or set [data] allow_changed = true to continue on the new set (the "
           "position is mapped and printed)";
  std::string how;
  *pos = data_position_map(now, saved, *pos, &how);
  std::printf("resume   [data] allow_changed: %s files differ from the checkpoint's:%s\n"
              "resume   data position %s\n", now.what.c_str(), diff.c_str(), how.c_str());
  return "";
}

// A mix record: the same number of datasets, each compared; its state becomes *state.
static std::string compare_mix(const std::string& ckpt, const std::string& path,
                               const std::string& text, bool allow_changed,
                               const DataMix& train, DataMixState* state) {
  MixRecord saved;
  std::string problem = data_mix_record_parse(text, path, &saved);
  if (!problem.empty()) return problem;
  const size_t K = train.sources.size();
  if (saved.patterns.size() != K)
    return ckpt + " was trained on " + std::to_string(saved.patterns.size()) +
           " datasets, [data] train names " + std::to_string(K) + ": their positions do not "
           "carry over (resume with the same datasets)";
  *state = saved.state;
  for (size_t k = 0; k < K && problem.empty(); k++) {
    if (saved.weights[k] != train.weights[k] || saved.patterns[k] != train.patterns[k])
      std::printf("resume   note: %s dataset %zu was '%s' with weight %g, now '%s' with weight "
                  "%g: the rows drawn from now on use the new weights\n", train.what.c_str(), k,
                  saved.patterns[k].c_str(), saved.weights[k], train.patterns[k].c_str(),
                  train.weights[k]);
    problem = compare_files(ckpt, allow_changed, train.sources[k], saved.shards[k],
                            run_record().shards[k], &state->pos[k]);
  }
  return problem;
}

// Rank 0: "" or the refusal; *state read or mapped.
static std::string compare(const std::string& ckpt, bool allow_changed, const DataMix& train,
                           DataMixState* state) {
  const std::string path = ckpt + "/" + kDataRecordName;
  std::string text;
  const bool mix = train.sources.size() > 1;
  if (!read_text_file(path, &text)) {
    if (mix) return ckpt + " has no " + kDataRecordName + " (written by an older trainer): the "
                    "positions of the datasets of [data] train are not known";
    std::printf("resume   note: %s has no %s (written by an older trainer): the train files "
                "are not compared with the ones it was trained on\n", ckpt.c_str(),
                kDataRecordName);
    return "";
  }
  if (is_mix_record(text) || mix) {
    if (!is_mix_record(text))
      return ckpt + " was trained on one dataset, [data] train names " +
             std::to_string(train.sources.size()) + ": their positions do not carry over "
             "(resume with the same datasets)";
    return compare_mix(ckpt, path, text, allow_changed, train, state);
  }
  std::vector<ShardRecord> saved;
  std::string problem = data_manifest_parse(text, path, &saved);
  if (!problem.empty()) return problem;
  return compare_files(ckpt, allow_changed, train.sources[0], saved, run_record().shards[0],
                       &state->pos[0]);
}

std::string data_record_resume(const std::string& ckpt, bool allow_changed,
                               const DataMix& train, DataMixState* state, Comm& world) {
  std::string problem;
  if (world.rank == 0) problem = compare(ckpt, allow_changed, train, state);
  const size_t K = train.sources.size(), n = 1 + 4 * K;  // rows; epoch, shard, row, rows each
  std::vector<int64_t> mine(n), all(n * (size_t)world.size);
  mine[0] = state->rows;
  for (size_t k = 0; k < K; k++) {
    const DataPosition& p = state->pos[k];
    const int64_t v[4] = {p.epoch, p.shard, p.row, state->rows_of[k]};
    std::copy(v, v + 4, &mine[1 + 4 * k]);
  }
  all_gather_host(world, mine.data(), n * sizeof(int64_t), all.data());
  state->rows = all[0];  // rank 0's
  for (size_t k = 0; k < K; k++) {
    state->pos[k] = DataPosition{all[1 + 4 * k], all[2 + 4 * k], all[3 + 4 * k]};
    state->rows_of[k] = all[4 + 4 * k];
  }
  return problem;
}
