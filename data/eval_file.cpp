// data/eval_file.cpp - llm.c's multiple-choice eval files (data/eval_file.h).
#include "data/eval_file.h"

#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>

#include "kernels/common.h"

namespace {

constexpr int32_t kEvalMagic = 20240522;

// The stream of values after the header, and where the reader is in it.
struct EvalStream {
  std::vector<unsigned char> bytes;
  size_t at = 1024;  // after the header
  int width = 2;     // bytes per value
  bool more() const { return at < bytes.size(); }
  bool has(size_t values) const { return at + values * width <= bytes.size(); }
  int64_t next() {
    uint32_t v = 0;
    std::memcpy(&v, &bytes[at], width);  // little-endian host
    at += width;
    return width == 2 ? (int64_t)(v & 0xffff) : (int64_t)v;
  }
};

// One example at s.at, checked; refuses with `where` ("[eval] file x: example 3 (byte 2048)").
ChoiceExample read_example(EvalStream& s, int index, int V, int T, const std::string& where) {
  const size_t start = s.at;
  const int64_t marker = s.width == 2 ? 0xffff : 0xffffffffLL;
  CHECK_ALL(s.has(6), "%s: the file ends inside the record's header", where.c_str());
  CHECK_ALL(s.next() == marker, "%s: no start marker (%lld) where the record should begin",
            where.c_str(), (long long)marker);
  const int64_t bytes = s.next(), got_index = s.next();
  ChoiceExample ex;
  ex.label = (int)s.next();
  const int64_t endings = s.next();
  CHECK_ALL(bytes >= 6 * s.width && start + bytes <= s.bytes.size(),
            "%s: a size of %lld bytes, the file has %zu left", where.c_str(), (long long)bytes,
            s.bytes.size() - start);
  CHECK_ALL(got_index == index, "%s: index %lld, expected %d", where.c_str(),
            (long long)got_index, index);
  CHECK_ALL(endings >= 2 && ex.label < endings, "%s: label %d of %lld endings", where.c_str(),
            ex.label, (long long)endings);
  const size_t end = start + bytes;
  auto tokens = [&](const char* part) {
    CHECK_ALL(s.at + s.width <= end, "%s: the %s runs past the record's %lld bytes",
              where.c_str(), part, (long long)bytes);
    const int64_t n = s.next();
    CHECK_ALL(n >= 1 && s.at + n * s.width <= end, "%s: the %s has %lld tokens, past the "
              "record's %lld bytes", where.c_str(), part, (long long)n, (long long)bytes);
    std::vector<int> ids(n);
    for (int64_t i = 0; i < n; i++) {
      const int64_t id = s.next();
      CHECK_ALL(id < V, "%s: token %lld of the %s is %lld, outside the vocabulary of %d",
                where.c_str(), (long long)i, part, (long long)id, V);
      ids[i] = (int)id;
    }
    return ids;
  };
  ex.context = tokens("context");
  for (int64_t e = 0; e < endings; e++) {
    ex.endings.push_back(tokens("ending"));
    const size_t len = ex.context.size() + ex.endings.back().size() - 1;
    CHECK_ALL(len <= (size_t)T, "%s: context + ending %lld are %zu positions, more than "
              "[model] seq_len %d", where.c_str(), (long long)e, len, T);
  }
  CHECK_ALL(s.at == end, "%s: %zu bytes left over after the endings", where.c_str(), end - s.at);
  return ex;
}

}  // namespace

std::vector<ChoiceExample> eval_file_read(const std::string& path, const std::string& what,
                                          int V, int T, int max_examples) {
  std::ifstream in(path, std::ios::binary);
  CHECK_ALL(in.good(), "%s: cannot read %s", what.c_str(), path.c_str());
  EvalStream s;
  s.bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  CHECK_ALL(s.bytes.size() >= 1024, "%s: %s has %zu bytes, less than the 1024-byte header",
            what.c_str(), path.c_str(), s.bytes.size());
  int32_t header[4];
  std::memcpy(header, s.bytes.data(), sizeof(header));
  CHECK_ALL(header[0] == kEvalMagic, "%s: %s is not an llm.c eval file (magic %d, expected %d)",
            what.c_str(), path.c_str(), header[0], kEvalMagic);
  CHECK_ALL(header[1] == 1 || header[1] == 2, "%s: %s has version %d (1: uint16 tokens, "
            "2: uint32)", what.c_str(), path.c_str(), header[1]);
  CHECK_ALL(header[2] >= 1, "%s: %s holds %d examples", what.c_str(), path.c_str(), header[2]);
  s.width = header[1] == 1 ? 2 : 4;
  const int n = max_examples > 0 && max_examples < header[2] ? max_examples : header[2];
  std::vector<ChoiceExample> examples;
  for (int i = 0; i < header[2]; i++) {  // every record is checked, even past max_examples
    const std::string where = what + " " + path + ": example " + std::to_string(i) + " (byte " +
                              std::to_string(s.at) + ")";
    ChoiceExample ex = read_example(s, i, V, T, where);
    if (i < n) examples.push_back(std::move(ex));
  }
  CHECK_ALL(!s.more(), "%s: %s has %zu bytes after its %d examples", what.c_str(), path.c_str(),
            s.bytes.size() - s.at, header[2]);
  return examples;
}
