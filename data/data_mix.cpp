// data/data_mix.cpp - several datasets mixed with weights (data/data_mix.h): the draw of each
// global row's dataset, the datasets' takes, the state, and the checkpoint record's text.
#include "data/data_mix.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "kernels/common.h"
#include "kernels/counter_rng.h"

namespace {

constexpr uint64_t kMixStream = 0x6d69785f726f7773ull;  // "mix_rows": the draws' own stream
constexpr const char* kMixHeader =
    "# data mix, format 1: \"mix <datasets> <rows drawn>\", then per dataset \"dataset <weight> "
    "<epoch> <shard> <row> <rows drawn from it> <glob>\" and its data manifest\n";

std::string text_of(const char* fmt, long long a, long long b, long long c) {
  char line[128];
  std::snprintf(line, sizeof(line), fmt, a, b, c);
  return line;
}

}  // namespace

void data_mix_init(DataMix& mix, const std::vector<std::string>& patterns,
                   const std::vector<double>& weights, const char* what, int B, int T,
                   int dp_rank, int dp_size, bool shuffle, uint64_t seed, int vocab_size) {
  if (patterns.empty() || (patterns.size() > 1 && weights.size() != patterns.size()))
    BUG("%s: %zu globs, %zu weights", what, patterns.size(), weights.size());
  mix = DataMix();
  mix.patterns = patterns, mix.weights = weights, mix.what = what;
  mix.B = B, mix.T = T, mix.dp_rank = dp_rank, mix.dp_size = dp_size;
  mix.sources.resize(patterns.size());
  for (size_t k = 0; k < patterns.size(); k++) {
    const std::string name = patterns.size() == 1 ? std::string(what)
                             : std::string(what) + " dataset " + std::to_string(k);
    dataloader_init(mix.sources[k], patterns[k], name.c_str(), B, T, dp_rank, dp_size, shuffle,
                    seed + k, vocab_size);
  }
  double sum = 0, acc = 0;
  for (size_t k = 0; k < patterns.size(); k++) sum += weights.empty() ? 1.0 : weights[k];
  for (size_t k = 0; k < patterns.size(); k++) {
    acc += weights.empty() ? 1.0 : weights[k];
    mix.upper.push_back(k + 1 == patterns.size() ? 1.0 : acc / sum);
  }
  mix.seed = seed;
  mix.rows_of.assign(patterns.size(), 0);
}

int data_mix_source(const DataMix& mix, int64_t row) {
  if (mix.sources.size() == 1) return 0;
  const uint64_t stream = splitmix64(mix.seed ^ kMixStream);
  const uint64_t x = splitmix64(stream + (uint64_t)row * kSplitMixGamma);
  const double u = uniform53(x);  // [0, 1)
  for (size_t k = 0; k + 1 < mix.upper.size(); k++)
    if (u < mix.upper[k]) return (int)k;
  return (int)mix.upper.size() - 1;
}

// Reads dataset k's rows of this global micro-batch: it takes its `count` next rows; this rank
// reads those of them in its slice and puts each at its row of inputs/targets.
static void take_from(DataMix& mix, int k, int64_t count, int* inputs, int* targets) {
  const int64_t B = mix.B, T = mix.T, mine = (int64_t)mix.dp_rank * B;
  int64_t before = 0, n = 0;  // dataset k's rows before this rank's slice, and in it
  for (int64_t g = 0; g < mine + B; g++)
    if (mix.source_of_row[g] == k) (g < mine ? before : n)++;
  if (n == B) {  // every row of the slice: straight into the batch (one dataset: dataloader_next)
    dataloader_take(mix.sources[k], count, before, n, inputs, targets);
    return;
  }
  mix.scratch_inputs.resize((size_t)(n * T));
  mix.scratch_targets.resize((size_t)(n * T));
  dataloader_take(mix.sources[k], count, before, n, mix.scratch_inputs.data(),
                  mix.scratch_targets.data());
  for (int64_t b = 0, j = 0; b < B; b++) {
    if (mix.source_of_row[mine + b] != k) continue;
    std::memcpy(inputs + b * T, &mix.scratch_inputs[j * T], T * sizeof(int));
    std::memcpy(targets + b * T, &mix.scratch_targets[j * T], T * sizeof(int));
    j++;
  }
}

void data_mix_next(DataMix& mix, int* inputs, int* targets) {
  const int64_t G = (int64_t)mix.dp_size * mix.B;
  const int K = (int)mix.sources.size();
  mix.source_of_row.resize(G);
  std::vector<int64_t> count(K, 0);
  for (int64_t g = 0; g < G; g++) count[mix.source_of_row[g] = data_mix_source(mix, mix.rows + g)]++;
  for (int k = 0; k < K; k++) {
    if (count[k] == 0) continue;
    take_from(mix, k, count[k], inputs, targets);
    mix.rows_of[k] += count[k];
  }
  mix.rows += G;
}

void data_mix_set_seed(DataMix& mix, uint64_t seed) {
  mix.seed = seed;
  for (size_t k = 0; k < mix.sources.size(); k++) mix.sources[k].seed = seed + k;
}

DataMixState data_mix_state(const DataMix& mix) {
  DataMixState s;
  s.rows = mix.rows;
  s.rows_of = mix.rows_of;
  for (const DataLoader& dl : mix.sources) s.pos.push_back(dl.pos);
  return s;
}

void data_mix_seek(DataMix& mix, const DataMixState& state) {
  if (state.pos.size() != mix.sources.size() || state.rows_of.size() != mix.sources.size())
    BUG("%s: a state of %zu datasets for %zu", mix.what.c_str(), state.pos.size(),
        mix.sources.size());
  mix.rows = state.rows;
  mix.rows_of = state.rows_of;
  for (size_t k = 0; k < mix.sources.size(); k++) dataloader_seek(mix.sources[k], state.pos[k]);
}

std::string data_mix_span(const DataMix& mix, const DataMixState& from) {
  if (mix.sources.size() == 1) return dataloader_span(mix.sources[0], from.pos[0]);
  std::string text;
  for (size_t k = 0; k < mix.sources.size(); k++) {
    const DataPosition& p = from.pos[k];
    const DataPosition& now = mix.sources[k].pos;
    if (p.epoch == now.epoch && p.shard == now.shard && p.row == now.row) continue;
    text += (text.empty() ? "" : "; ") + dataloader_span(mix.sources[k], p);
  }
  return text;
}

std::string data_mix_counts(const DataMix& mix) {
  std::string text;
  for (size_t k = 0; k < mix.sources.size(); k++) {
    char line[160];
    std::snprintf(line, sizeof(line), " (weight %g): %lld rows = %lld tokens (%.1f%%)",
                  mix.weights.empty() ? 1.0 : mix.weights[k], (long long)mix.rows_of[k],
                  (long long)mix.rows_of[k] * mix.T,
                  mix.rows > 0 ? 100.0 * mix.rows_of[k] / mix.rows : 0.0);
    text += (k ? ", '" : "'") + mix.patterns[k] + "'" + line;
  }
  return text;
}

// ---------------------------------------------------------------------------------------------
// The checkpoint record

bool is_mix_record(const std::string& text) {
  return text.compare(0, std::strlen(kMixHeader), kMixHeader) == 0;
}

std::string data_mix_record_text(const MixRecord& r) {
  std::string text = kMixHeader;
  const size_t K = r.patterns.size();
  text += text_of("mix %lld %lld\n", (long long)K, (long long)r.state.rows, 0);
  for (size_t k = 0; k < K; k++) {
    char line[200];
    const DataPosition& p = r.state.pos[k];
    std::snprintf(line, sizeof(line), "dataset %.17g %lld %lld %lld %lld ", r.weights[k],
                  (long long)p.epoch, (long long)p.shard, (long long)p.row,
                  (long long)r.state.rows_of[k]);
    text += line + r.patterns[k] + "\n" + data_manifest_text(r.shards[k]);
  }
  return text;
}

// The dataset line "dataset <weight> <epoch> <shard> <row> <rows> <glob>" into `out`.
static bool parse_dataset_line(const std::string& line, MixRecord* out) {
  double w = 0;
  long long e = 0, s = 0, row = 0, rows = 0;
  int used = 0;
  if (std::sscanf(line.c_str(), "dataset %lf %lld %lld %lld %lld %n", &w, &e, &s, &row, &rows,
                  &used) != 5 || used <= 0 || (size_t)used >= line.size() || !(w > 0) ||
      e < 0 || s < 0 || row < 0 || rows < 0)
    return false;
  out->weights.push_back(w);
  out->state.pos.push_back(DataPosition{e, s, row});
  out->state.rows_of.push_back(rows);
  out->patterns.push_back(line.substr((size_t)used));
  return true;
}

std::string data_mix_record_parse(const std::string& text, const std::string& source,
                                  MixRecord* out) {
  *out = MixRecord();
  if (!is_mix_record(text)) return source + ": line 1 is not the data mix's header";
  std::istringstream in(text.substr(std::strlen(kMixHeader)));
  std::string line;
  long long K = 0, rows = 0;
  char extra = 0;
  if (!std::getline(in, line) || std::sscanf(line.c_str(), "mix %lld %lld %c", &K, &rows,
                                             &extra) != 2 || K < 1 || K > 1000000 || rows < 0)
    return source + ": line 2: expected \"mix <datasets> <rows drawn>\"";
  out->state.rows = rows;
  int n = 3;
  for (long long k = 0; k < K; k++) {
    if (!std::getline(in, line) || !parse_dataset_line(line, out))
      return source + ": line " + std::to_string(n) + ": expected \"dataset <weight> <epoch> "
             "<shard> <row> <rows drawn from it> <glob>\"";
    const int manifest_line = ++n;
    std::string manifest;  // its data manifest: up to its end line
    while (std::getline(in, line)) {
      manifest += line + "\n";
      n++;
      if (line.compare(0, 4, "end ") == 0) break;
    }
    std::vector<ShardRecord> shards;
    const std::string problem = data_manifest_parse(
        manifest, source + " (dataset " + std::to_string(k) + ", from line " +
                      std::to_string(manifest_line) + ")", &shards);
    if (!problem.empty()) return problem;
    out->shards.push_back(shards);
  }
  if (std::getline(in, line)) return source + ": line " + std::to_string(n) + ": text after the "
                                  "last dataset";
  return "";
}
