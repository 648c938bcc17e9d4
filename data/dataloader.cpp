// data/dataloader.cpp - llm.c token shards in, (B,T) batches of inputs and targets out (the order
// is specified in data/dataloader.h).
//
// Reading. Shards are never loaded whole (a fineweb shard is 200 MB): each call opens the current
// shard, preads exactly the tokens it needs and closes it again. Unshuffled, a rank's B rows are
// contiguous, so that is one pread of B*T+1 tokens at token offset (s*dp + r)*B*T, llm.c's exact
// arithmetic; shuffled, it is one pread of T+1 tokens per row. Tokens (uint16 or uint32 on disk,
// little-endian) come back as int32.
//
// Counting. A shard of n tokens holds rows = (n-1)/T rows (row i = tokens [i*T, i*T+T]) and
// rows/G global micro-batches of G = dp*B rows. That equals llm.c's shard_num_samples =
// (n-1)/(nproc*B*T): (s+1)*G <= (n-1)/T exactly when (s+1)*G*T <= n-1. The rows left over at the
// end of a shard are skipped, as in llm.c.
//
// Shuffling. Permutations come from a counter-based generator: draw i of the stream keyed by
// (seed, epoch, shard) is splitmix64(key + i*golden), so an epoch's shard order and every
// shard's row order can be rebuilt from the position alone (seek needs no replay). Nothing
// depends on dp: ranks slice the same global order, so a fixed G gives the same batches at any
// dp. Each process builds the permutations itself (no communication).
#include "data/dataloader.h"

#include <fcntl.h>
#include <glob.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdarg>
#include <climits>
#include <cstdio>

#include "kernels/common.h"

namespace {

constexpr int64_t kHeaderBytes = 256 * sizeof(int32_t);
constexpr int32_t kMagicU16 = 20240520, kVersionU16 = 1;  // GPT-2 shards, uint16 tokens
constexpr int32_t kMagicU32 = 20240801, kVersionU32 = 7;  // Llama-3 shards, uint32 tokens
constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ull;
constexpr uint64_t kShardOrderStream = ~0ull;  // the "shard" key of an epoch's shard order

uint64_t splitmix64(uint64_t x) {
  x += kGolden;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t stream_key(uint64_t seed, int64_t epoch, uint64_t shard) {
  return splitmix64(splitmix64(splitmix64(seed) ^ (uint64_t)epoch) ^ shard);
}

// A uniformly random permutation of 0..n-1 (Fisher-Yates); draws below a bound use rejection
// sampling so the result is exact and the same on every platform.
std::vector<int64_t> random_permutation(int64_t n, uint64_t key) {
  std::vector<int64_t> perm(n);
  for (int64_t i = 0; i < n; i++) perm[i] = i;
  uint64_t counter = 0;
  for (int64_t i = n - 1; i > 0; i--) {
    uint64_t bound = (uint64_t)i + 1, limit = UINT64_MAX - UINT64_MAX % bound, x;
    do x = splitmix64(key + (counter++) * kGolden);
    while (x >= limit);
    std::swap(perm[i], perm[(int64_t)(x % bound)]);
  }
  return perm;
}

int64_t rows_in_shard(const DataLoader& dl, int64_t file) {
  return (dl.num_tokens[file] - 1) / dl.T;
}
int64_t global_rows(const DataLoader& dl) { return (int64_t)dl.dp_size * dl.B; }
int64_t current_file(const DataLoader& dl) { return dl.shard_order[dl.pos.shard]; }

// Rebuilds the shard order of pos.epoch and the row order of the current shard.
void build_orders(DataLoader& dl) {
  int64_t n = (int64_t)dl.files.size();
  if (dl.shuffle) {
    dl.shard_order = random_permutation(n, stream_key(dl.seed, dl.pos.epoch, kShardOrderStream));
    int64_t file = current_file(dl);
    dl.row_order =
        random_permutation(rows_in_shard(dl, file), stream_key(dl.seed, dl.pos.epoch, file));
  } else {
    dl.shard_order.resize(n);
    for (int64_t i = 0; i < n; i++) dl.shard_order[i] = i;
    dl.row_order.clear();
  }
}

void advance_shard(DataLoader& dl) {
  dl.pos.row = 0;
  if (++dl.pos.shard == (int64_t)dl.files.size()) {
    dl.pos.shard = 0;
    dl.pos.epoch++;
  }
  build_orders(dl);
}

// pread of `count` tokens starting at token `first` of an open shard into dl.buffer.
void read_tokens(DataLoader& dl, int fd, int64_t file, int64_t first, int64_t count) {
  int tb = dl.token_bytes[file];
  size_t bytes = (size_t)count * tb;
  dl.buffer.resize(bytes);
  off_t offset = (off_t)(kHeaderBytes + first * tb);
  size_t done = 0;
  while (done < bytes) {
    ssize_t got = pread(fd, dl.buffer.data() + done, bytes - done, offset + (off_t)done);
    if (got < 0 && errno == EINTR) continue;
    CHECK(got > 0,
          "shard '%s': short read of %zu bytes at offset %lld (file changed while training?)",
          dl.files[file].c_str(), bytes, (long long)offset);
    done += (size_t)got;
  }
}

// The shard's header against what it said at start-up: a shard rewritten while training (another
// token width or count) would otherwise be read with the old width and length.
void check_header_unchanged(const DataLoader& dl, int fd, int64_t file) {
  int32_t h[3] = {0, 0, 0};
  const bool got = pread(fd, h, sizeof(h), 0) == (ssize_t)sizeof(h);
  const int tb = h[0] == kMagicU16 ? 2 : h[0] == kMagicU32 ? 4 : 0;
  if (got && tb == dl.token_bytes[file] && h[2] == dl.num_tokens[file]) return;
  FATAL("%s: shard '%s' changed while training: it held %lld %s tokens at start-up, its header "
        "now says %s%lld tokens", dl.what.c_str(), dl.files[file].c_str(),
        (long long)dl.num_tokens[file], dl.token_bytes[file] == 4 ? "uint32" : "uint16",
        tb == 4 ? "uint32, " : tb == 2 ? "uint16, " : "(no valid magic) ", (long long)h[2]);
}

// Token k of dl.buffer (the host is little-endian, like the files).
int64_t buffer_token(const DataLoader& dl, int64_t file, int64_t k) {
  if (dl.token_bytes[file] == 2) {
    uint16_t t;
    std::memcpy(&t, dl.buffer.data() + 2 * k, 2);
    return t;
  }
  uint32_t t;
  std::memcpy(&t, dl.buffer.data() + 4 * k, 4);
  return t;
}

// Token k of dl.buffer (token `first` + k of the shard) as an int; stops the job if it is not
// below the vocabulary (or does not fit an int).
int checked_token(const DataLoader& dl, int64_t file, int64_t first, int64_t k) {
  const int64_t token = buffer_token(dl, file, k);
  const int64_t limit = dl.vocab_size > 0 ? dl.vocab_size : (int64_t)INT_MAX + 1;
  if (token < limit) return (int)token;
  const int64_t offset = first + k;
  FATAL("%s: shard '%s': token %lld at offset %lld (byte %lld) is not below %s %lld: the shard "
        "was made with another tokenizer, or is damaged", dl.what.c_str(),
        dl.files[file].c_str(), (long long)token, (long long)offset,
        (long long)(kHeaderBytes + offset * dl.token_bytes[file]),
        dl.vocab_size > 0 ? "[model] vocab_size =" : "the int32 limit", (long long)limit);
}

// Reads `rows` consecutive rows starting at row `row` into inputs/targets (rows*T each).
void read_rows(DataLoader& dl, int fd, int64_t file, int64_t row, int64_t rows, int* inputs,
               int* targets) {
  int64_t n = rows * dl.T;
  read_tokens(dl, fd, file, row * dl.T, n + 1);
  for (int64_t k = 0; k <= n; k++) {
    const int token = checked_token(dl, file, row * dl.T, k);
    if (k < n) inputs[k] = token;
    if (k > 0) targets[k - 1] = token;
  }
}

}  // namespace

std::vector<std::string> glob_files(const std::string& pattern) {
  std::vector<std::string> files;
  glob_t g;
  if (glob(pattern.c_str(), 0, nullptr, &g) == 0) {
    for (size_t i = 0; i < g.gl_pathc; i++) files.push_back(g.gl_pathv[i]);
  }
  globfree(&g);
  std::sort(files.begin(), files.end());  // byte order, whatever the locale
  return files;
}

// printf into a std::string of any length (messages name paths up to PATH_MAX).
__attribute__((format(printf, 1, 2))) static std::string format(const char* fmt, ...) {
  va_list args, again;
  va_start(args, fmt);
  va_copy(again, args);
  const int n = std::vsnprintf(nullptr, 0, fmt, args);
  std::string text(n > 0 ? (size_t)n : 0, '\0');
  if (n > 0) std::vsnprintf(&text[0], (size_t)n + 1, fmt, again);
  va_end(again);
  va_end(args);
  return text;
}

std::string shard_check(const std::string& path, int64_t* num_tokens, int* token_bytes) {
  struct stat st;  // before opening: a FIFO would block the open
  if (stat(path.c_str(), &st) != 0)
    return format("shard '%s': cannot open (%s)", path.c_str(), std::strerror(errno));
  if (S_ISDIR(st.st_mode)) return format("shard '%s': a directory, not a shard", path.c_str());
  if (!S_ISREG(st.st_mode))
    return format("shard '%s': not a regular file (a device, FIFO or socket), not a shard",
                  path.c_str());
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return format("shard '%s': cannot open (%s)", path.c_str(), std::strerror(errno));
  int32_t header[256] = {0};
  size_t got = std::fread(header, 1, sizeof(header), f);
  int64_t size = fstat(fileno(f), &st) == 0 ? (int64_t)st.st_size : -1;
  std::fclose(f);
  if (got != sizeof(header))
    return format("shard '%s': %lld bytes, shorter than the 1024-byte header", path.c_str(),
                  (long long)size);
  int32_t magic = header[0], version = header[1];
  int tb = magic == kMagicU16 ? 2 : magic == kMagicU32 ? 4 : 0;
  if (tb == 0)
    return format("shard '%s': bad magic %d, expected %d (uint16 tokens) or %d (uint32 tokens)",
                  path.c_str(), magic, kMagicU16, kMagicU32);
  int32_t expected_version = tb == 2 ? kVersionU16 : kVersionU32;
  if (version != expected_version)
    return format("shard '%s': bad version %d, expected %d for magic %d", path.c_str(), version,
                  expected_version, magic);
  int64_t ntok = header[2];
  int64_t expected_size = kHeaderBytes + ntok * tb;
  if (ntok < 0 || size != expected_size)
    return format("shard '%s': %lld bytes, expected %lld (1024-byte header + %lld tokens of %d "
                  "bytes)", path.c_str(), (long long)size, (long long)expected_size,
                  (long long)ntok, tb);
  if (num_tokens) *num_tokens = ntok;
  if (token_bytes) *token_bytes = tb;
  return "";
}

void dataloader_init(DataLoader& dl, const std::string& pattern, const char* what, int B, int T,
                     int dp_rank, int dp_size, bool shuffle, uint64_t seed, int vocab_size) {
  CHECK(B > 0 && T > 0, "%s: batch size B=%d and sequence length T=%d must be positive", what, B,
        T);
  CHECK(dp_size > 0 && dp_rank >= 0 && dp_rank < dp_size, "%s: dp rank %d out of range for dp %d",
        what, dp_rank, dp_size);
  dl = DataLoader();
  dl.B = B, dl.T = T, dl.dp_rank = dp_rank, dl.dp_size = dp_size;
  dl.shuffle = shuffle, dl.seed = seed;
  dl.what = what, dl.vocab_size = vocab_size;
  dl.files = glob_files(pattern);
  CHECK_ALL(!dl.files.empty(), "%s: no file matches '%s'", what, pattern.c_str());
  int64_t G = global_rows(dl);
  for (const std::string& path : dl.files) {
    int64_t ntok = 0;
    int tb = 0;
    std::string err = shard_check(path, &ntok, &tb);
    CHECK_ALL(err.empty(), "%s: %s", what, err.c_str());
    CHECK_ALL((ntok - 1) / T >= G,
              "%s: shard '%s' has %lld tokens, too few for one global micro-batch of dp*B = "
              "%lld rows of T+1 = %d tokens (needs at least %lld tokens)",
              what, path.c_str(), (long long)ntok, (long long)G, T + 1, (long long)(G * T + 1));
    dl.num_tokens.push_back(ntok);
    dl.token_bytes.push_back(tb);
  }
  dataloader_reset(dl);
}

void dataloader_take(DataLoader& dl, int64_t count, int64_t first, int64_t n, int* inputs,
                     int* targets) {
  while (dl.pos.row + count > rows_in_shard(dl, current_file(dl))) advance_shard(dl);
  const int64_t file = current_file(dl);
  if (n > 0) {
    const std::string& path = dl.files[file];
    const int fd = open(path.c_str(), O_RDONLY);
    CHECK(fd >= 0, "shard '%s': cannot open (%s)", path.c_str(), std::strerror(errno));
    struct Closer {  // a bad token stops the job from inside read_rows
      int fd;
      ~Closer() { close(fd); }
    } closer{fd};
    check_header_unchanged(dl, fd, file);
    first += dl.pos.row;  // the first row wanted, in the order
    if (dl.row_order.empty()) {
      read_rows(dl, fd, file, first, n, inputs, targets);
    } else {
      for (int64_t b = 0; b < n; b++) {
        const int64_t row = dl.row_order[first + b];
        read_rows(dl, fd, file, row, 1, inputs + b * dl.T, targets + b * dl.T);
      }
    }
  }
  dl.pos.row += count;
}

void dataloader_next(DataLoader& dl, int* inputs, int* targets) {
  dataloader_take(dl, global_rows(dl), (int64_t)dl.dp_rank * dl.B, dl.B, inputs, targets);
}

void dataloader_reset(DataLoader& dl) { dataloader_seek(dl, DataPosition()); }

void dataloader_seek(DataLoader& dl, const DataPosition& pos) {
  CHECK_ALL(pos.epoch >= 0 && pos.shard >= 0 && pos.shard < (int64_t)dl.files.size() &&
                pos.row >= 0,
            "data position (epoch %lld, shard %lld, row %lld) is out of range for %zu shard(s)",
            (long long)pos.epoch, (long long)pos.shard, (long long)pos.row, dl.files.size());
  dl.pos = pos;
  build_orders(dl);
}

std::string dataloader_span(const DataLoader& dl, const DataPosition& from) {
  return format("%s rows (epoch %lld, shard %lld, row %lld) to (epoch %lld, shard %lld = '%s', "
                "row %lld)", dl.what.c_str(), (long long)from.epoch, (long long)from.shard,
                (long long)from.row, (long long)dl.pos.epoch, (long long)dl.pos.shard,
                dl.files[current_file(dl)].c_str(), (long long)dl.pos.row);
}

int64_t dataloader_num_batches(const DataLoader& dl) {
  int64_t total = 0;
  for (size_t f = 0; f < dl.files.size(); f++)
    total += rows_in_shard(dl, (int64_t)f) / global_rows(dl);
  return total;
}
