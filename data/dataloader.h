// data/dataloader.h - llm.c token shards in, (B,T) batches of inputs and targets out.
//
// Shards: a 1024-byte header of 256 little-endian int32 (magic, version, token count, ...) then
// the tokens: GPT-2 style (magic 20240520, version 1, uint16) or Llama-3 style (20240801, 7,
// uint32). Each shard is validated (magic, version, exact file size) with an error naming it.
//
// Order. The data is cut into rows of T+1 tokens overlapping by one (inputs, targets shifted by
// one): row i of a shard starts at token i*T. A global micro-batch is G = dp * B consecutive rows
// of the current order; dp rank r takes rows [r*B, (r+1)*B) of it. With shuffle = false the
// order is the shards in glob order and their rows in order, which is exactly llm.c's unshuffled
// DataLoader with nproc = dp: process r reads B*T+1 tokens at offset (s*nproc + r)*B*T of a
// shard. A shard is left when fewer than G*T+1 tokens remain; after the last shard a new epoch
// starts at the first. With shuffle = true each epoch permutes the shard order and the rows in
// each shard with a RNG seeded by (seed, epoch, shard): reproducible, and independent of dp for
// a fixed G.
//
// Token ids. A shard made with another tokenizer (or damaged) holds ids at or past the model's
// vocabulary; the embedding would read outside its table (or, vocabulary-parallel, silently
// read zeros). So the loader checks every id it hands out against [model] vocab_size.
//
// The position is kept layout-independent (epoch, shard, row) so that a checkpoint written with
// one dp resumes with another.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

struct DataPosition {
  int64_t epoch = 0;
  int64_t shard = 0;  // index into this epoch's shard order
  int64_t row = 0;    // next row (in this shard's order) of the next global micro-batch
};

struct DataLoader {
  std::vector<std::string> files;  // sorted glob matches
  std::vector<int64_t> num_tokens; // per file
  std::vector<int> token_bytes;    // 2 or 4, per file
  std::string what;                // the config key, for messages ("[data] train")
  int B = 0, T = 0, dp_rank = 0, dp_size = 1;
  int vocab_size = 0;              // every token read must be below it (0: not checked)
  bool shuffle = false;
  uint64_t seed = 0;
  DataPosition pos;
  std::vector<int64_t> shard_order;  // this epoch's order of files
  std::vector<int64_t> row_order;    // this shard's row order (empty = identity)
  std::vector<uint8_t> buffer;       // read buffer
};

// `what` names the config key in errors ("[data] train"). Exits with a message if the glob
// matches nothing or a shard is malformed. vocab_size > 0: every token read is checked against
// it (below).
void dataloader_init(DataLoader& dl, const std::string& pattern, const char* what, int B, int T,
                     int dp_rank, int dp_size, bool shuffle, uint64_t seed, int vocab_size = 0);
// Fills inputs and targets (B*T each, host) with this rank's rows of the next global micro-batch.
// Every token is checked as it is read, before any kernel can see it: an id >= vocab_size stops
// the job (FATAL: the rank that read it may be alone) naming the key, the shard, the token's
// offset in the shard, the id and the vocab size.
void dataloader_next(DataLoader& dl, int* inputs, int* targets);
// What dataloader_next does, for any count (data/data_mix.h): the next `count` rows of the order
// (moving on to the next shard first when fewer remain in this one, as dataloader_next does for
// dp*B rows; count must not exceed dp*B, which every shard holds), of which rows [first, first+n)
// are read into inputs/targets (n*T each). dataloader_next = take(dp*B, dp_rank*B, B).
void dataloader_take(DataLoader& dl, int64_t count, int64_t first, int64_t n, int* inputs,
                     int* targets);
void dataloader_reset(DataLoader& dl);  // back to the start (validation passes)
void dataloader_seek(DataLoader& dl, const DataPosition& pos);
// The rows read since position `from`, for a log line: "[data] train rows (epoch 0, shard 1 =
// 'train_001.bin', row 96) to (epoch 0, shard 1, row 100)".
std::string dataloader_span(const DataLoader& dl, const DataPosition& from);
// Number of global micro-batches in one pass over the data (validation sizing).
int64_t dataloader_num_batches(const DataLoader& dl);
// Validates one shard file; returns "" or an error message naming the file.
std::string shard_check(const std::string& path, int64_t* num_tokens, int* token_bytes);
// Expands a glob pattern (sorted); empty if nothing matches.
std::vector<std::string> glob_files(const std::string& pattern);
