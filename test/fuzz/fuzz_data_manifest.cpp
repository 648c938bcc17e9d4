// test/fuzz/fuzz_data_manifest.cpp - a checkpoint's data.txt (data/data_manifest.h): parsing
// it, then, for one that parses, comparing it with a set of two made-up files and carrying a
// data position (epoch, shard, row from the input's first bytes) from it onto that set, shuffled
// or not, as a resume with [data] allow_changed = true does.
#include <vector>

#include "data/data_manifest.h"
#include "test/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz_catch_stops();
  const std::string text((const char*)data, size);
  std::vector<ShardRecord> saved;
  try {
    if (!data_manifest_parse(text, "data.txt", &saved).empty() || saved.empty()) return 0;
    DataLoader now;  // two shards of 9000 and 5000 uint16 tokens, rows of T = 64
    now.files = {"data/train_000.bin", saved[0].path};
    now.num_tokens = {9000, 5000};
    now.token_bytes = {2, 2};
    now.B = 1, now.T = 64;
    now.shuffle = size > 0 && (data[0] & 1);
    now.seed = 1337;
    data_manifest_diff(saved, std::vector<ShardRecord>(saved.begin() + saved.size() / 2,
                                                      saved.end()));
    const DataPosition pos{size > 1 ? data[1] % 3 : 0,
                           size > 2 ? (int64_t)(data[2] % (saved.size() + 1)) : 0,
                           size > 3 ? data[3] * 7 : 0};
    if (pos.shard >= (int64_t)saved.size()) return 0;  // resume checks it against the saved set
    std::string how;
    data_position_map(now, saved, pos, &how);
  } catch (const FuzzStop&) {
  }
  return 0;
}
