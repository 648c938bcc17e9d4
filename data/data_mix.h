// data/data_mix.h - several datasets mixed with weights: [data] train = ["a/*.bin", "b/*.bin"]
// and weights = [0.7, 0.3]. Each row of the global batch comes from one dataset, drawn at random
// with the weights' probabilities; each dataset is read in its own order (data/dataloader.h) from
// its own position.
//
// The draw. Global row n of the run (n counts every rank's rows: the rows of global micro-batch
// m are n = m*G .. m*G + G-1, G = dp * micro_batch, rank r holding [r*B, r*B+B) of them) comes
// from the dataset d whose slice of [0, 1) holds u(n) = splitmix64(key(seed) + n*golden) / 2^64
// (the slices in order, each its weight / sum of the weights). So the dataset of a row depends on
// the seed and the row's place in the run (its step and its index in the step's global batch),
// never on the layout: every rank draws the whole global micro-batch (G draws, no
// communication) and reads its own rows of it. Dataset d's rows of a global micro-batch are the
// next c_d rows of its order, taken the way dataloader_next takes dp*B rows (dataloader_take);
// rank r reads the ones among its slice. Over N rows dataset d's count is Binomial(N, w_d): within
// a few sqrt(N w_d (1 - w_d)) of N w_d. The draws do not depend on how the step's rows are cut
// into micro-batches either; the rows read do, at a shard's end, as with a single glob: the c_d
// rows of a global micro-batch come from one shard (a shard with fewer left is left).
//
// One dataset (a plain glob string, or an array of one, any weight) is today's loader exactly:
// every row draws dataset 0 (no draw is made), c_0 = G, and the take is dataloader_next's.
// Dataset k shuffles ([data] shuffle) with seed + k: dataset 0 as a single glob would.
//
// The state a checkpoint keeps (DataMixState: rows drawn in all and per dataset, each dataset's
// position) is layout-independent like DataPosition. With two or more datasets it is written in
// the checkpoint's data.txt (checkpoint/data_record.h) as the text of data_mix_record_text.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/data_manifest.h"
#include "data/dataloader.h"

struct DataMixState {
  int64_t rows = 0;               // global rows drawn so far, all datasets
  std::vector<int64_t> rows_of;   // ... from each dataset
  std::vector<DataPosition> pos;  // each dataset's position
};

struct DataMix {
  std::vector<DataLoader> sources;  // one per glob, in [data] train's order
  std::vector<std::string> patterns;
  std::vector<double> weights;      // as given (empty: one dataset)
  std::vector<double> upper;        // each dataset's slice of [0, 1) ends here (the last at 1)
  std::string what;                 // "[data] train"
  int B = 0, T = 0, dp_rank = 0, dp_size = 1;
  uint64_t seed = 0;
  int64_t rows = 0;                 // DataMixState's counts
  std::vector<int64_t> rows_of;
  std::vector<int> source_of_row;   // this global micro-batch's draws (G)
  std::vector<int> scratch_inputs, scratch_targets;
};

// The datasets' loaders (dataloader_init each; errors name `what`, the glob and, with several,
// the dataset's index). weights: one per pattern, positive (checked by the config already; here
// a mismatch is a bug). Empty weights with one pattern: that dataset alone.
void data_mix_init(DataMix& mix, const std::vector<std::string>& patterns,
                   const std::vector<double>& weights, const char* what, int B, int T,
                   int dp_rank, int dp_size, bool shuffle, uint64_t seed, int vocab_size = 0);
// This rank's rows (B*T inputs and targets) of the next global micro-batch.
void data_mix_next(DataMix& mix, int* inputs, int* targets);
// The dataset global row `row` comes from (the draw above); 0 with one dataset.
int data_mix_source(const DataMix& mix, int64_t row);
void data_mix_set_seed(DataMix& mix, uint64_t seed);
DataMixState data_mix_state(const DataMix& mix);
void data_mix_seek(DataMix& mix, const DataMixState& state);
// The rows read since `from`, for a log line: one dataset, dataloader_span's text; several, each
// dataset's that moved.
std::string data_mix_span(const DataMix& mix, const DataMixState& from);
// "'a/*.bin' (weight 0.7): 336 rows = 21504 tokens (70.0%), ..." - the rows drawn so far.
std::string data_mix_counts(const DataMix& mix);

// The checkpoint record of a mix (data.txt), datasets' files included:
//   # data mix, format 1: "mix <datasets> <rows drawn>", then per dataset "dataset <weight>
//   <epoch> <shard> <row> <rows drawn from it> <glob>" and its data manifest
//   mix 2 4800
//   dataset 0.69999999999999996 0 1 288 3366 a/*.bin
//   # data manifest, format 1: ...
//   ...
//   end 2
//   dataset 0.29999999999999999 0 0 144 1434 b/*.bin
//   ...
struct MixRecord {
  DataMixState state;
  std::vector<double> weights;
  std::vector<std::string> patterns;
  std::vector<std::vector<ShardRecord>> shards;  // per dataset
};
bool is_mix_record(const std::string& text);
std::string data_mix_record_text(const MixRecord& record);
// "" or what is wrong (naming `source` and the line).
std::string data_mix_record_parse(const std::string& text, const std::string& source,
                                  MixRecord* out);
