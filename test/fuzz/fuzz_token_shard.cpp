// test/fuzz/fuzz_token_shard.cpp - an llm.c token shard (data/dataloader.h): the header checks,
// then, for a shard that passes, a loader over it (batch and sequence length from the input's
// first bytes, shuffled or not) reading every batch of an epoch with the token ids checked
// against a vocabulary of 50257.
#include <vector>

#include "data/dataloader.h"
#include "test/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz_catch_stops();
  const std::string path = fuzz_file("shard.bin", data, size);
  int64_t tokens = 0;
  int width = 0;
  if (!shard_check(path, &tokens, &width).empty()) return 0;
  const int B = 1 + (size > 12 ? data[12] % 4 : 0), T = 1 + (size > 13 ? data[13] % 32 : 7);
  const bool shuffle = size > 14 && (data[14] & 1);
  try {
    DataLoader dl;
    dataloader_init(dl, path, "[data] train", B, T, 0, 1, shuffle, 1337, 50257);
    std::vector<int> inputs((size_t)B * T), targets((size_t)B * T);
    const int64_t batches = dataloader_num_batches(dl);
    for (int64_t i = 0; i < batches && i < 4096; i++)
      dataloader_next(dl, inputs.data(), targets.data());
  } catch (const FuzzStop&) {
  }
  return 0;
}
