// data/data_manifest.cpp - the records of data/data_manifest.h: computing, writing, parsing and
// comparing them, and carrying a data position onto a changed set.
#include "data/data_manifest.h"

#include <fcntl.h>
#include <unistd.h>

#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <sstream>

namespace {

constexpr size_t kHashedBytes = 8192;
constexpr const char* kHeader =
    "# data manifest, format 1: <bytes> <tokens> <token bytes> <fnv1a64 of the first 8 KiB> "
    "<path>\n";

uint64_t fnv1a64(const unsigned char* p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

std::string record_text(const ShardRecord& r) {
  char line[96];
  std::snprintf(line, sizeof(line), "%lld %lld %d %016" PRIx64 " ", (long long)r.bytes,
                (long long)r.tokens, r.token_bytes, r.head_hash);
  return line + r.path;
}

bool same_content(const ShardRecord& a, const ShardRecord& b) {
  return a.bytes == b.bytes && a.tokens == b.tokens && a.token_bytes == b.token_bytes &&
         a.head_hash == b.head_hash;
}

const char* width(int token_bytes) { return token_bytes == 4 ? "uint32" : "uint16"; }

}  // namespace

std::string data_manifest_of(const DataLoader& dl, std::vector<ShardRecord>* out) {
  out->clear();
  unsigned char head[kHashedBytes];
  for (size_t f = 0; f < dl.files.size(); f++) {
    ShardRecord r;
    r.path = dl.files[f];
    r.tokens = dl.num_tokens[f];
    r.token_bytes = dl.token_bytes[f];
    r.bytes = 1024 + r.tokens * r.token_bytes;
    const int fd = open(r.path.c_str(), O_RDONLY);
    if (fd < 0) return "shard '" + r.path + "': cannot open (" + std::strerror(errno) + ")";
    const ssize_t got = pread(fd, head, sizeof(head), 0);
    close(fd);
    if (got < 0) return "shard '" + r.path + "': cannot read (" + std::strerror(errno) + ")";
    r.head_hash = fnv1a64(head, (size_t)got);
    out->push_back(r);
  }
  return "";
}

std::string data_manifest_text(const std::vector<ShardRecord>& shards) {
  std::string text = kHeader;
  for (const ShardRecord& r : shards) text += record_text(r) + "\n";
  return text + "end " + std::to_string(shards.size()) + "\n";
}

std::string data_manifest_parse(const std::string& text, const std::string& source,
                                std::vector<ShardRecord>* out) {
  out->clear();
  std::istringstream in(text);
  std::string line;
  if (!std::getline(in, line) || line + "\n" != kHeader)
    return source + ": line 1 is not the data manifest's header";
  for (int n = 2; std::getline(in, line); n++) {
    const std::string where = source + ": line " + std::to_string(n) + ": ";
    if (line.compare(0, 4, "end ") == 0) {
      char* end = nullptr;
      const unsigned long long count = std::strtoull(line.c_str() + 4, &end, 10);
      if (end == line.c_str() + 4 || *end != '\0' || count != out->size())
        return where + "\"" + line + "\" does not count the " + std::to_string(out->size()) +
               " files listed";
      if (std::getline(in, line)) return where + "text after the end line";
      return "";
    }
    long long bytes = 0, tokens = 0;
    int token_bytes = 0, used = 0;
    uint64_t hash = 0;
    if (std::sscanf(line.c_str(), "%lld %lld %d %16" SCNx64 " %n", &bytes, &tokens, &token_bytes,
                    &hash, &used) != 4 || used <= 0 || (size_t)used >= line.size() ||
        tokens < 0 || tokens > INT32_MAX || (token_bytes != 2 && token_bytes != 4) ||
        bytes != 1024 + tokens * token_bytes)  // a shard's header counts its tokens in an int32
      return where + "cannot parse \"" + line.substr(0, 200) + "\"";
    ShardRecord r;
    r.path = line.substr((size_t)used);
    r.bytes = bytes, r.tokens = tokens, r.token_bytes = token_bytes, r.head_hash = hash;
    out->push_back(r);
  }
  return source + ": no end line (cut off)";
}

std::string data_manifest_diff(const std::vector<ShardRecord>& saved,
                               const std::vector<ShardRecord>& now) {
  std::string diff;
  auto find = [](const std::vector<ShardRecord>& in, const std::string& path) {
    for (const ShardRecord& r : in)
      if (r.path == path) return &r;
    return (const ShardRecord*)nullptr;
  };
  for (const ShardRecord& r : now)
    if (!find(saved, r.path)) diff += "\n  added:   " + r.path;
  for (const ShardRecord& r : saved) {
    const ShardRecord* n = find(now, r.path);
    if (!n) {
      diff += "\n  removed: " + r.path;
      continue;
    }
    if (same_content(r, *n)) continue;
    char what[200];
    if (n->token_bytes != r.token_bytes)
      std::snprintf(what, sizeof(what), "%s tokens, now %s", width(r.token_bytes),
                    width(n->token_bytes));
    else if (n->tokens != r.tokens)
      std::snprintf(what, sizeof(what), "%lld tokens, now %lld", (long long)r.tokens,
                    (long long)n->tokens);
    else
      std::snprintf(what, sizeof(what), "same size, other content (its first 8 KiB differ)");
    diff += "\n  changed: " + r.path + " (" + what + ")";
  }
  if (diff.empty() && saved.size() == now.size()) return "";
  return diff.empty() ? "\n  the same files in another order" : diff;
}

DataPosition data_position_map(const DataLoader& now, const std::vector<ShardRecord>& saved,
                               const DataPosition& pos, std::string* how) {
  std::string was = "(shard index " + std::to_string(pos.shard) + ")";
  int64_t file = -1;  // the file being read, in the current set, if it is unchanged
  if (!saved.empty() && pos.shard >= 0 && pos.shard < (int64_t)saved.size()) {
    DataLoader old = now;  // the saved set under the same seed and order rules
    old.files.clear(), old.num_tokens.clear(), old.token_bytes.clear();
    for (const ShardRecord& r : saved) {
      old.files.push_back(r.path);
      old.num_tokens.push_back(r.tokens);
      old.token_bytes.push_back(r.token_bytes);
    }
    dataloader_seek(old, pos);
    const ShardRecord& reading = saved[(size_t)old.shard_order[(size_t)pos.shard]];
    was = "'" + reading.path + "'";
    for (size_t f = 0; f < now.files.size(); f++)
      if (now.files[f] == reading.path && now.num_tokens[f] == reading.tokens &&
          now.token_bytes[f] == reading.token_bytes)
        file = (int64_t)f;
  }
  DataPosition to = pos;
  DataLoader probe = now;
  if (file >= 0) {  // the same file, at its place in this epoch's new order
    dataloader_seek(probe, DataPosition{pos.epoch, 0, 0});
    for (size_t s = 0; s < probe.shard_order.size(); s++)
      if (probe.shard_order[s] == file) to.shard = (int64_t)s;
  } else if (to.shard >= (int64_t)now.files.size()) {
    to = DataPosition{pos.epoch + 1, 0, 0};
  }
  const int64_t rows = (now.num_tokens[(size_t)(file >= 0 ? file : 0)] - 1) / now.T;
  if (file >= 0 && to.row >= rows) to.row = 0;  // rows past the end: the shard's start
  if (file < 0) to.row = 0;
  char text[160];
  std::snprintf(text, sizeof(text), "(epoch %lld, shard %lld, row %lld) -> (epoch %lld, shard "
                "%lld, row %lld)", (long long)pos.epoch, (long long)pos.shard, (long long)pos.row,
                (long long)to.epoch, (long long)to.shard, (long long)to.row);
  *how = std::string(text) + ": the checkpoint was reading " + was + (file >= 0 ?
         ", which is unchanged: it continues there in the new order" :
         ", which is gone or changed: the same shard index of the new set, from its first row");
  return to;
}
