// tools/bpe.cpp - byte-level BPE encoding (tools/bpe.h).
//
// Each pre-token (tools/pretokenize.cpp) starts as one token per byte; the adjacent pair with
// the lowest merge rank is merged everywhere, left to right, until no pair has a rank. That is
// OpenAI's encoder.py and what Hugging Face's BPE computes (its heap merges the lowest rank,
// leftmost first: the same result). Every merge result is a vocabulary entry, so token ids stand
// in for strings. With ignore_merges (Llama-3's tokenizer.json) a piece that is a vocabulary
// entry as a whole is that token, merges or not. The tokens of each distinct piece are cached.
#include "tools/bpe.h"

#include <utility>

#include "kernels/common.h"

std::vector<int> unicode_to_byte_table() {
  std::vector<int> table(256 + 68, -1);
  int next = 256;
  for (int b = 0; b < 256; b++) {
    bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    table[printable ? b : next++] = b;
  }
  return table;
}

std::string unicode_to_bytes(const std::string& s, const std::vector<int>& table,
                             const char* where) {
  std::string bytes;
  for (size_t i = 0; i < s.size();) {
    uint32_t cp;
    i += utf8_decode(s, i, &cp);
    CHECK(cp < table.size() && table[cp] >= 0,
          "%s: '%s' is not in the byte-level BPE's byte-to-unicode alphabet", where, s.c_str());
    bytes += (char)table[cp];
  }
  return bytes;
}

uint64_t bpe_pair_key(int left, int right) {
  return ((uint64_t)(uint32_t)left << 32) | (uint32_t)right;
}

JsonValue json_parse_or_die(const std::string& text, const std::string& name) {
  JsonValue root;
  const std::string error = json_parse(text, &root);
  CHECK(error.empty(), "'%s': %s", name.c_str(), error.c_str());
  return root;
}

long long json_id(const JsonValue& v, long long max) {
  return v.kind == JsonValue::Number && v.is_integer && v.integer >= 0 && v.integer <= max
             ? v.integer : -1;
}

void bpe_set_byte_tokens(ByteLevelBpe& bpe, const char* where) {
  for (int b = 0; b < 256; b++) {
    auto it = bpe.ids.find(std::string(1, (char)b));
    CHECK(it != bpe.ids.end(), "'%s': no token for byte %d", where, b);
    bpe.byte_token[b] = it->second;
  }
}

namespace {

const std::vector<int>& bpe_piece(ByteLevelBpe& v, const std::string& bytes) {
  auto cached = v.cache.find(bytes);
  if (cached != v.cache.end()) return cached->second;
  std::vector<int> word;
  auto whole = v.ignore_merges ? v.ids.find(bytes) : v.ids.end();
  if (whole != v.ids.end()) return v.cache.emplace(bytes, std::vector<int>{whole->second}).first->second;
  for (unsigned char b : bytes) word.push_back(v.byte_token[b]);
  while (word.size() > 1) {
    const BpeMerge* best = nullptr;
    uint64_t best_key = 0;
    for (size_t i = 0; i + 1 < word.size(); i++) {
      auto it = v.merges.find(bpe_pair_key(word[i], word[i + 1]));
      if (it != v.merges.end() && (!best || it->second.rank < best->rank))
        best = &it->second, best_key = it->first;
    }
    if (!best) break;
    std::vector<int> merged;
    for (size_t i = 0; i < word.size(); i++) {
      if (i + 1 < word.size() && bpe_pair_key(word[i], word[i + 1]) == best_key) {
        merged.push_back(best->merged);
        i++;
      } else {
        merged.push_back(word[i]);
      }
    }
    word.swap(merged);
  }
  return v.cache.emplace(bytes, std::move(word)).first->second;
}

}  // namespace

void bpe_encode(ByteLevelBpe& bpe, const std::string& text, std::vector<int>& out) {
  std::vector<std::pair<size_t, size_t>> pieces;
  pretokenize(text, bpe.pattern, pieces);
  for (const auto& [begin, end] : pieces) {
    const std::vector<int>& tokens = bpe_piece(bpe, text.substr(begin, end - begin));
    out.insert(out.end(), tokens.begin(), tokens.end());
  }
}
