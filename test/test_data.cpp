// test/test_data.cpp - checks data/dataloader.cpp and data/tokenizer.cpp.
//
// Fresh random shards (v1 uint16 and v7 uint32, awkward sizes, several per dataset) are written
// to a temporary folder, then:
//  - unshuffled batches equal, token for token, a re-implementation of llm.c's DataLoader
//    arithmetic (process r reads B*T+1 tokens at (s*nproc + r)*B*T, (n-1)/(nproc*B*T) batches
//    per shard, wrap to the first shard) for several (B, dp, rank), across epoch wraps;
//  - dp slicing: rank r of dp ranks gets rows [r*B, (r+1)*B) of the dp=1 loader with dp*B rows;
//  - gradient accumulation: a micro-batches of a dp=1 loader hold the rows of one global
//    micro-batch of a dp=a loader (shards whose row counts are multiples of every G);
//  - shuffle: same seed same batches, another seed other batches, every row at most once per
//    epoch and exactly once when a shard's rows are a multiple of G, shard order permuted per
//    epoch, independent of dp for a fixed G;
//  - seek to a saved position resumes identically, also under another dp with the same G;
//  - every malformed input (bad magic, bad version, truncated, short header, empty glob, shard
//    too small) ends the process (a forked child) non-zero with a message naming the file;
//  - the tokenizer file round-trips pieces and decodes ids, out-of-range ones as "<id>".
// Exits non-zero on any failure. SEED=<n> reproduces a run.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "data/dataloader.h"
#include "data/tokenizer.h"
#include "kernels/common.h"
#include "test/check_results.h"

namespace {

// ------------------------------------------------------------------ shards on disk

struct Dataset {
  std::string pattern;
  std::vector<std::vector<uint32_t>> shards;  // tokens of each file, in glob order
};

void write_shard(const std::string& path, int32_t magic, int32_t version, int64_t header_tokens,
                 const std::vector<uint32_t>& tokens, int width) {
  int32_t header[256] = {magic, version, (int32_t)header_tokens};
  FILE* f = std::fopen(path.c_str(), "wb");
  CHECK(f, "cannot create %s", path.c_str());
  std::fwrite(header, sizeof(header), 1, f);
  for (uint32_t t : tokens) std::fwrite(&t, width, 1, f);  // little-endian host
  std::fclose(f);
}

// Shards dir/name_000.bin, ... of random tokens (uint16 for width 2, up to 2^31-1 for width 4).
Dataset make_dataset(const std::string& dir, const std::string& name, int width,
                     const std::vector<int64_t>& sizes, std::mt19937_64& rng) {
  Dataset d;
  d.pattern = dir + "/" + name + "_*.bin";
  uint32_t max_token = width == 2 ? 65535u : 0x7fffffffu;
  for (size_t s = 0; s < sizes.size(); s++) {
    std::vector<uint32_t> tokens(sizes[s]);
    for (auto& t : tokens) t = (uint32_t)(rng() % ((uint64_t)max_token + 1));
    char path[512];
    std::snprintf(path, sizeof(path), "%s/%s_%03zu.bin", dir.c_str(), name.c_str(), s);
    write_shard(path, width == 2 ? 20240520 : 20240801, width == 2 ? 1 : 7, sizes[s], tokens,
                width);
    d.shards.push_back(tokens);
  }
  return d;
}

// ------------------------------------------------------------------ batches

struct Batch {
  std::vector<int> inputs, targets;
  bool operator==(const Batch& o) const { return inputs == o.inputs && targets == o.targets; }
  bool operator!=(const Batch& o) const { return !(*this == o); }
};

Batch next_batch(DataLoader& dl) {
  Batch b;
  b.inputs.resize((size_t)dl.B * dl.T);
  b.targets.resize((size_t)dl.B * dl.T);
  dataloader_next(dl, b.inputs.data(), b.targets.data());
  return b;
}

// Rows [first, first+count) of a batch, as a batch of `count` rows.
Batch rows_of(const Batch& b, int T, int first, int count) {
  Batch r;
  r.inputs.assign(b.inputs.begin() + (size_t)first * T,
                  b.inputs.begin() + (size_t)(first + count) * T);
  r.targets.assign(b.targets.begin() + (size_t)first * T,
                   b.targets.begin() + (size_t)(first + count) * T);
  return r;
}

Batch concat(const std::vector<Batch>& parts) {
  Batch all;
  for (const Batch& p : parts) {
    all.inputs.insert(all.inputs.end(), p.inputs.begin(), p.inputs.end());
    all.targets.insert(all.targets.end(), p.targets.begin(), p.targets.end());
  }
  return all;
}

DataLoader make_loader(const Dataset& d, int B, int T, int rank, int dp, bool shuffle,
                       uint64_t seed) {
  DataLoader dl;
  dataloader_init(dl, d.pattern, "[data] test", B, T, rank, dp, shuffle, seed);
  return dl;
}

// llm.c's DataLoader (dataloader.h), unshuffled, in tokens instead of bytes.
struct LlmcLoader {
  const Dataset& d;
  int B, T, rank, nproc;
  size_t shard = 0;
  int64_t sample = 0;

  int64_t shard_num_samples() const {
    return ((int64_t)d.shards[shard].size() - 1) / ((int64_t)nproc * B * T);
  }
  Batch next() {
    if (sample >=
        shard_num_samples()) {  // dataloader_advance_: next shard, or reset after the last
      shard = shard + 1 == d.shards.size() ? 0 : shard + 1;
      sample = 0;
    }
    int64_t offset = sample * nproc * B * T + (int64_t)rank * B * T;
    Batch b;
    for (int64_t k = 0; k < (int64_t)B * T; k++) {
      b.inputs.push_back((int)d.shards[shard][offset + k]);
      b.targets.push_back((int)d.shards[shard][offset + k + 1]);
    }
    sample++;
    return b;
  }
};

// ------------------------------------------------------------------ tests

void test_matches_llmc(Results& r, const Dataset& d, const char* name, int T) {
  const int layouts[][2] = {{3, 1}, {3, 2}, {2, 3}, {1, 4}, {6, 1}};  // (B, dp)
  for (const auto& layout : layouts) {
    int B = layout[0], dp = layout[1];
    for (int rank = 0; rank < dp; rank++) {
      DataLoader dl = make_loader(d, B, T, rank, dp, false, 0);
      LlmcLoader ref{d, B, T, rank, dp};
      int64_t per_epoch = dataloader_num_batches(dl), expected = 0;
      for (const auto& s : d.shards) expected += ((int64_t)s.size() - 1) / ((int64_t)dp * B * T);
      r.check(per_epoch == expected, "%s B=%d dp=%d: %lld batches per epoch, llm.c has %lld", name,
              B, dp, (long long)per_epoch, (long long)expected);
      int64_t steps = 2 * per_epoch + 3, bad = -1;
      for (int64_t s = 0; s < steps && bad < 0; s++) {
        if (next_batch(dl) != ref.next()) bad = s;
      }
      r.check(bad < 0, "%s B=%d T=%d dp=%d rank %d: batch %lld differs from llm.c's", name, B, T,
              dp, rank, (long long)bad);
      r.check(dl.pos.epoch == 2, "%s B=%d dp=%d: epoch %lld after %lld batches, expected 2", name,
              B, dp, (long long)dl.pos.epoch, (long long)steps);
    }
  }
}

// rank r of dp loaders with B rows == rows [r*B, (r+1)*B) of one loader with dp*B rows.
void test_dp_slicing(Results& r, const Dataset& d, int T, bool shuffle, uint64_t seed) {
  const int B = 2;
  for (int dp : {2, 3}) {
    DataLoader whole = make_loader(d, B * dp, T, 0, 1, shuffle, seed);
    std::vector<DataLoader> ranks;
    for (int rank = 0; rank < dp; rank++)
      ranks.push_back(make_loader(d, B, T, rank, dp, shuffle, seed));
    int64_t steps = 2 * dataloader_num_batches(whole) + 1, bad = -1;
    for (int64_t s = 0; s < steps && bad < 0; s++) {
      Batch g = next_batch(whole);
      for (int rank = 0; rank < dp; rank++) {
        if (next_batch(ranks[rank]) != rows_of(g, T, rank * B, B)) bad = s;
      }
    }
    r.check(bad < 0, "dp slicing (shuffle %d, dp %d, B %d): step %lld differs from dp=1 B=%d",
            shuffle, dp, B, (long long)bad, B * dp);
  }
}

// a consecutive micro-batches of a dp=1 loader == one global micro-batch of dp=a loaders.
void test_grad_accum(Results& r, const Dataset& d, int T, bool shuffle, uint64_t seed) {
  const int B = 2, accum = 3;
  DataLoader single = make_loader(d, B, T, 0, 1, shuffle, seed);
  std::vector<DataLoader> ranks;
  for (int rank = 0; rank < accum; rank++)
    ranks.push_back(make_loader(d, B, T, rank, accum, shuffle, seed));
  int64_t steps = 2 * dataloader_num_batches(ranks[0]) + 1, bad = -1;
  for (int64_t s = 0; s < steps && bad < 0; s++) {
    std::vector<Batch> micro, global;
    for (int a = 0; a < accum; a++) micro.push_back(next_batch(single));
    for (int rank = 0; rank < accum; rank++) global.push_back(next_batch(ranks[rank]));
    if (concat(micro) != concat(global)) bad = s;
  }
  r.check(bad < 0,
          "grad accumulation (shuffle %d): %d micro-batches of dp=1 differ from dp=%d at step %lld",
          shuffle, accum, accum, (long long)bad);
}

// Key of a row: its T+1 tokens (random tokens make rows distinct).
std::string row_key(const int* inputs, int last_target, int T) {
  std::string key((const char*)inputs, (size_t)T * sizeof(int));
  return key.append((const char*)&last_target, sizeof(int));
}

void test_shuffle(Results& r, const Dataset& d, int T, uint64_t seed) {
  const int B = 3, G = B;
  std::unordered_map<std::string, std::pair<int, int64_t>> where;  // row key -> (shard, row)
  for (size_t s = 0; s < d.shards.size(); s++) {
    std::vector<int> tok(d.shards[s].begin(), d.shards[s].end());
    for (int64_t row = 0; row < ((int64_t)tok.size() - 1) / T; row++)
      where[row_key(&tok[row * T], tok[row * T + T], T)] = {(int)s, row};
  }
  DataLoader a = make_loader(d, B, T, 0, 1, true, seed),
             again = make_loader(d, B, T, 0, 1, true, seed);
  DataLoader other = make_loader(d, B, T, 0, 1, true, seed + 1);
  int64_t per_epoch = dataloader_num_batches(a);
  bool same_as_again = true, same_as_other = true, rows_known = true, epochs_differ = false;
  int shard_orders_permuted = 0;
  std::set<std::vector<int>> shard_orders;
  std::vector<Batch> first_epoch;
  const int epochs = 8;
  for (int epoch = 0; epoch < epochs; epoch++) {
    std::map<std::pair<int, int64_t>, int> seen;
    std::vector<int> shard_visits;
    std::pair<int, int64_t> previous = {-1, -1};
    int64_t in_order = 0;  // rows that directly follow their predecessor in the file
    for (int64_t s = 0; s < per_epoch; s++) {
      Batch b = next_batch(a);
      same_as_again &= b == next_batch(again);
      if (epoch == 0) same_as_other &= b == next_batch(other), first_epoch.push_back(b);
      if (epoch == 1) epochs_differ |= b != first_epoch[s];
      for (int k = 0; k < B; k++) {
        auto it = where.find(row_key(&b.inputs[k * T], b.targets[k * T + T - 1], T));
        if (it == where.end()) {
          rows_known = false;
          continue;
        }
        int shard = it->second.first;
        seen[it->second]++;
        in_order += shard == previous.first && it->second.second == previous.second + 1;
        previous = it->second;
        if (shard_visits.empty() || shard_visits.back() != shard) shard_visits.push_back(shard);
      }
    }
    r.check(a.pos.epoch == epoch && (int64_t)shard_visits.size() == (int64_t)d.shards.size(),
            "shuffle epoch %d: visits %zu shard runs, expected each of %zu shards once", epoch,
            shard_visits.size(), d.shards.size());
    shard_orders_permuted += !std::is_sorted(shard_visits.begin(), shard_visits.end());
    shard_orders.insert(shard_visits);
    for (size_t s = 0; s < d.shards.size(); s++) {
      int64_t rows = ((int64_t)d.shards[s].size() - 1) / T, used = rows / G * G, distinct = 0,
              repeats = 0;
      for (const auto& [key, count] : seen)
        distinct += key.first == (int)s, repeats += key.first == (int)s && count > 1;
      r.check(distinct == used && repeats == 0,
              "shuffle epoch %d shard %zu: %lld distinct rows (%lld repeated), "
              "expected %lld of %lld rows once each",
              epoch, s, (long long)distinct, (long long)repeats, (long long)used, (long long)rows);
    }
    r.check(in_order < (int64_t)seen.size() / 2, "shuffle epoch %d: %lld of %zu rows in file order",
            epoch, (long long)in_order, seen.size());
  }
  r.check(rows_known, "shuffle: every returned row is a row i*T..i*T+T of some shard");
  r.check(same_as_again, "shuffle: the same seed gives the same batches");
  r.check(!same_as_other, "shuffle: another seed gives other batches");
  r.check(epochs_differ, "shuffle: epoch 1 differs from epoch 0");
  r.check(shard_orders_permuted > 0 && shard_orders.size() > 1,
          "shuffle: shard order permuted in %d of %d "
          "epochs, %zu distinct orders",
          shard_orders_permuted, epochs, shard_orders.size());
}

// Saving a position and seeking to it (same layout, and dp=1 with the same G) resumes identically.
void test_seek(Results& r, const Dataset& d, int T, bool shuffle, uint64_t seed) {
  const int B = 2, dp = 2;
  DataLoader probe = make_loader(d, B, T, 0, dp, shuffle, seed);
  int64_t per_epoch = dataloader_num_batches(probe);
  int64_t first_shard = ((int64_t)d.shards[0].size() - 1) / T / (B * dp);
  for (int64_t k : {(int64_t)0, (int64_t)1, first_shard, per_epoch, per_epoch + 2}) {
    DataLoader run = make_loader(d, B, T, 1, dp, shuffle, seed);
    for (int64_t s = 0; s < k; s++) next_batch(run);
    DataPosition saved = run.pos;
    DataLoader same = make_loader(d, B, T, 1, dp, shuffle, seed);
    DataLoader single = make_loader(d, B * dp, T, 0, 1, shuffle, seed);
    next_batch(same);  // move away first: seek must not depend on the current state
    dataloader_seek(same, saved);
    dataloader_seek(single, saved);
    bool ok = true;
    for (int s = 0; s < per_epoch + 3; s++) {
      Batch expect = next_batch(run);
      ok &= next_batch(same) == expect;
      ok &= rows_of(next_batch(single), T, B, B) == expect;
    }
    r.check(
        ok,
        "seek (shuffle %d) to position after %lld batches (epoch %lld shard %lld row %lld) resumes "
        "identically, also at dp=1",
        shuffle, (long long)k, (long long)saved.epoch, (long long)saved.shard,
        (long long)saved.row);
  }
  DataLoader reset = make_loader(d, B, T, 0, dp, shuffle, seed),
             fresh = make_loader(d, B, T, 0, dp, shuffle, seed);
  for (int64_t s = 0; s < per_epoch + 1; s++) next_batch(reset);
  dataloader_reset(reset);
  r.check(next_batch(reset) == next_batch(fresh), "reset (shuffle %d) starts over", shuffle);
}

// Runs fn in a forked child; returns its exit status and what it wrote to stderr.
std::pair<int, std::string> run_child(const std::function<void()>& fn) {
  int fds[2];
  CHECK(pipe(fds) == 0, "pipe failed");
  std::fflush(stdout);
  std::fflush(stderr);
  pid_t pid = fork();
  CHECK(pid >= 0, "fork failed");
  if (pid == 0) {
    close(fds[0]);
    dup2(fds[1], 2);
    fn();
    std::fflush(stderr);
    _exit(0);
  }
  close(fds[1]);
  std::string err;
  char buf[4096];
  ssize_t n;
  while ((n = read(fds[0], buf, sizeof(buf))) > 0) err.append(buf, (size_t)n);
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128, err};
}

void expect_failure(Results& r, const std::string& pattern, int B, int T, const std::string& file,
                    const std::string& words) {
  if (!r.wanted(("error '" + words + "'").c_str())) return;  // a forked child each: skip early
  auto [status, err] = run_child([&] {
    DataLoader dl;
    dataloader_init(dl, pattern, "[data] train", B, T, 0, 1, false, 0);
  });
  bool named = err.find(file) != std::string::npos && err.find(words) != std::string::npos &&
               err.find("[data] train") != std::string::npos;
  r.check(status != 0 && named, "error '%s': exit %d, stderr names '%s': %s", words.c_str(), status,
          file.c_str(), err.c_str());
}

void test_errors(Results& r, const std::string& dir, std::mt19937_64& rng) {
  std::vector<uint32_t> tokens(200);
  for (auto& t : tokens) t = (uint32_t)(rng() % 50257);
  std::string base = dir + "/bad_";
  write_shard(base + "magic.bin", 12345, 1, 200, tokens, 2);
  write_shard(base + "version.bin", 20240520, 7, 200, tokens, 2);
  write_shard(base + "version7.bin", 20240801, 1, 200, tokens, 4);
  write_shard(base + "truncated.bin", 20240520, 1, 201, tokens, 2);
  write_shard(base + "long.bin", 20240801, 7, 199, tokens, 4);
  write_shard(base + "small.bin", 20240520, 1, 200, tokens, 2);
  FILE* f = std::fopen((base + "header.bin").c_str(), "wb");
  std::fwrite(tokens.data(), 4, 25, f);
  std::fclose(f);
  expect_failure(r, base + "magic.bin", 2, 8, base + "magic.bin", "bad magic 12345");
  expect_failure(r, base + "version.bin", 2, 8, base + "version.bin", "bad version 7, expected 1");
  expect_failure(r, base + "version7.bin", 2, 8, base + "version7.bin",
                 "bad version 1, expected 7");
  expect_failure(r, base + "truncated.bin", 2, 8, base + "truncated.bin",
                 "1424 bytes, expected 1426");
  expect_failure(r, base + "long.bin", 2, 8, base + "long.bin", "1824 bytes, expected 1820");
  expect_failure(r, base + "header.bin", 2, 8, base + "header.bin",
                 "shorter than the 1024-byte header");
  expect_failure(r, dir + "/nothing_*.bin", 2, 8, dir + "/nothing_*.bin", "no file matches");
  // 200 tokens hold (200-1)/T rows: T=33 gives 6 rows, one global batch of 6 but not of 7.
  expect_failure(r, base + "small.bin", 7, 33, base + "small.bin",
                 "too few for one global micro-batch");
  auto [status, err] = run_child([&] {
    DataLoader dl;
    dataloader_init(dl, base + "small.bin", "[data] train", 6, 33, 0, 1, false, 0);
  });
  r.check(status == 0, "a shard with exactly one global batch is accepted (exit %d: %s)", status,
          err.c_str());
  int64_t ntok = -1;
  int width = -1;
  r.check(shard_check(base + "small.bin", &ntok, &width).empty() && ntok == 200 && width == 2,
          "shard_check accepts a good shard (%lld tokens, %d bytes each)", (long long)ntok, width);
  r.check(shard_check(base + "magic.bin", nullptr, nullptr).find(base + "magic.bin") !=
              std::string::npos,
          "shard_check names the bad file");
}

void test_tokenizer(Results& r, const std::string& dir, std::mt19937_64& rng) {
  const int vocab = 300, eot = 299;
  std::vector<std::string> pieces(vocab);
  for (auto& p : pieces) {
    p.resize(1 + rng() % 20);
    for (auto& c : p) c = (char)(rng() % 256);
  }
  std::string path = dir + "/tokenizer.bin";
  int32_t header[256] = {20240328, 2, vocab, eot};
  FILE* f = std::fopen(path.c_str(), "wb");
  std::fwrite(header, sizeof(header), 1, f);
  for (const auto& p : pieces) std::fputc((int)p.size(), f), std::fwrite(p.data(), 1, p.size(), f);
  std::fclose(f);
  Tokenizer tok;
  r.check(tokenizer_load(tok, path) && tok.loaded && tok.eot == eot && tok.pieces == pieces,
          "tokenizer: loads %d pieces and end-of-text %d", vocab, tok.eot);
  std::vector<int> ids = {5, 0, eot, vocab, -3, 17};
  std::string expect = pieces[5] + pieces[0] + pieces[eot] + "<300><-3>" + pieces[17];
  r.check(tokenizer_decode(tok, ids.data(), (int)ids.size()) == expect,
          "tokenizer: decode, out of range as <id>");
  Tokenizer missing;
  r.check(!tokenizer_load(missing, dir + "/absent.bin") && !missing.loaded,
          "tokenizer: a missing file is no error");
  header[0] = 1234;
  f = std::fopen((dir + "/bad_tokenizer.bin").c_str(), "wb");
  std::fwrite(header, sizeof(header), 1, f);
  std::fclose(f);
  auto [status, err] = run_child([&] {
    Tokenizer t;
    tokenizer_load(t, dir + "/bad_tokenizer.bin");
  });
  r.check(status != 0 && err.find("bad_tokenizer.bin") != std::string::npos &&
              err.find("bad magic") != std::string::npos,
          "tokenizer: a malformed file exits naming it (exit %d: %s)", status, err.c_str());
}

// Random shard sizes in tokens, each holding at least `min_rows` rows of T.
std::vector<int64_t> awkward_sizes(std::mt19937_64& rng, int count, int T, int64_t min_rows) {
  std::vector<int64_t> sizes = {min_rows * T + 1, min_rows * T + T};  // the smallest, a near miss
  while ((int)sizes.size() < count) sizes.push_back(min_rows * T + 1 + (int64_t)(rng() % 600));
  std::shuffle(sizes.begin(), sizes.end(), rng);
  return sizes;
}

// The temporary folder, removed at exit - also when a FATAL in the loader ends the test early,
// but only by the process that made it (forked children exit too). A function-local static.
const std::string& temp_dir() {
  static std::string dir;
  static pid_t owner = 0;
  if (dir.empty()) {
    char dir_template[] = "/tmp/test_data.XXXXXX";
    CHECK(mkdtemp(dir_template), "mkdtemp failed");
    dir = dir_template;
    owner = getpid();
    std::atexit([] {
      if (getpid() != owner) return;
      std::string cleanup = "rm -rf '" + dir + "'";
      if (std::system(cleanup.c_str()) != 0)
        std::fprintf(stderr, "could not remove %s\n", dir.c_str());
    });
  }
  return dir;
}

}  // namespace

int main() {
  const char* seed_env = std::getenv("SEED");
  uint64_t seed = seed_env ? std::strtoull(seed_env, nullptr, 10) : std::random_device{}();
  std::printf("test_data: seed %llu (SEED=%llu reproduces)\n", (unsigned long long)seed,
              (unsigned long long)seed);
  std::mt19937_64 rng(seed);
  std::string dir = temp_dir();
  Results r;
  r.verbose = false;  // 234 checks: print the failures only

  const int T = 7;
  Dataset v1 = make_dataset(dir, "v1", 2, awkward_sizes(rng, 4, T, 6), rng);
  Dataset v7 = make_dataset(dir, "v7", 4, awkward_sizes(rng, 3, T, 6), rng);
  std::vector<int64_t> multiple_sizes;  // rows a multiple of every G used with it (1, 2, 3, 6)
  for (int s = 0; s < 3; s++)
    multiple_sizes.push_back((6 * (1 + (int64_t)(rng() % 12))) * T + 1 + (int64_t)(rng() % T));
  Dataset multiple = make_dataset(dir, "multiple", 2, multiple_sizes, rng);

  test_matches_llmc(r, v1, "v1", T);
  test_matches_llmc(r, v7, "v7", T);
  test_matches_llmc(r, v1, "v1 (T=1)", 1);
  for (bool shuffle : {false, true}) {
    test_dp_slicing(r, v1, T, shuffle, seed);
    test_dp_slicing(r, v7, T, shuffle, seed);
    test_grad_accum(r, multiple, T, shuffle, seed);
    test_seek(r, v1, T, shuffle, seed);
  }
  test_shuffle(r, v1, T, seed);
  test_shuffle(r, multiple, T, seed);
  test_errors(r, dir, rng);
  test_tokenizer(r, dir, rng);

  std::printf("test_data: %d of %d checks failed\n", r.failures, r.checks);
  return r.exit_status();
}
