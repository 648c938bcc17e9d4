// tools/gpt2_bpe.cpp - GPT-2's byte-pair encoder, computing what OpenAI's encoder.py computes.
//
//  1. Pre-tokenization by the regex
//       's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//     written out by hand as a scanner over UTF-8 code points that tries the alternatives in
//     order at each position, as the regex engine does (the lookahead becomes "leave the last
//     space of a run for the next piece").
//  2. Each piece's bytes start as one token per byte; the adjacent pair with the lowest merge
//     rank (vocab.bpe line) is merged everywhere, left to right, until no pair has a rank. Every
//     merge result is a vocabulary entry, so token ids stand in for encoder.py's strings; the
//     tokens of each distinct piece are cached.
// encoder.json and vocab.bpe spell bytes through GPT-2's byte-to-unicode table; it is undone at
// load time, so everything here works on raw bytes and any input (even invalid UTF-8, whose
// stray bytes count as punctuation) encodes and decodes back exactly. encoder.json is read by a
// small parser for its one shape: a flat object of \-escaped strings to integers.
//
// The one approximation is the character classes. \s is Unicode White_Space (a table, exact as
// Python's `regex` module has it); \p{N} is a table of the Basic Multilingual Plane's number
// ranges (exact there); \p{L} is glibc's iswalpha() under the C.UTF-8 locale minus zero-width
// combining marks (wcwidth 0) and circled letters. Compared code point by code point with
// `regex` (Unicode 15) this is exact on the BMP but for 244 spacing combining marks (Mc: vowel
// signs of Indic and Southeast Asian scripts, alphabetic to glibc, marks to Unicode); outside the
// BMP it misses numbers and letters newer than glibc's tables. Single-threaded.
#include "tools/gpt2_bpe.h"

#include <locale.h>
#include <wchar.h>
#include <wctype.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "kernels/common.h"

namespace {

constexpr const char* kEotText = "<|endoftext|>";

// ---------------------------------------------------------------- UTF-8 and character classes

// Decodes the code point at s[i] and returns its length. A malformed sequence yields one byte
// with code point U+FFFD.
size_t utf8_decode(const std::string& s, size_t i, uint32_t* cp) {
  unsigned char c = (unsigned char)s[i];
  size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
  if (len == 1) return *cp = c, 1;
  *cp = 0xFFFD;
  if (len == 0 || i + len > s.size()) return 1;
  uint32_t v = c & (0x7F >> len);
  for (size_t k = 1; k < len; k++) {
    unsigned char cc = (unsigned char)s[i + k];
    if ((cc >> 6) != 2) return 1;
    v = (v << 6) | (cc & 0x3F);
  }
  static const uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
  if (v < kMin[len] || v > 0x10FFFF || (v >= 0xD800 && v < 0xE000)) return 1;  // overlong etc.
  return *cp = v, len;
}

void utf8_append(std::string& s, uint32_t cp) {
  if (cp < 0x80) {
    s += (char)cp;
    return;
  }
  int len = cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
  s += (char)(((0xFF00 >> len) & 0xFF) | (cp >> (6 * (len - 1))));  // 110xxxxx, 1110xxxx, 11110xxx
  for (int k = len - 2; k >= 0; k--) s += (char)(0x80 | ((cp >> (6 * k)) & 0x3F));
}

enum class CharClass { Space, Letter, Number, Other };

// Unicode White_Space: what \s matches in Python's `regex` module.
bool is_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

// \p{N} (Nd, Nl, No) in the Basic Multilingual Plane, Unicode 15: first and last of each range.
const uint32_t kNumberRanges[][2] = {
    {0x30, 0x39},     {0xB2, 0xB3},     {0xB9, 0xB9},     {0xBC, 0xBE},     {0x660, 0x669},
    {0x6F0, 0x6F9},   {0x7C0, 0x7C9},   {0x966, 0x96F},   {0x9E6, 0x9EF},   {0x9F4, 0x9F9},
    {0xA66, 0xA6F},   {0xAE6, 0xAEF},   {0xB66, 0xB6F},   {0xB72, 0xB77},   {0xBE6, 0xBF2},
    {0xC66, 0xC6F},   {0xC78, 0xC7E},   {0xCE6, 0xCEF},   {0xD58, 0xD5E},   {0xD66, 0xD78},
    {0xDE6, 0xDEF},   {0xE50, 0xE59},   {0xED0, 0xED9},   {0xF20, 0xF33},   {0x1040, 0x1049},
    {0x1090, 0x1099}, {0x1369, 0x137C}, {0x16EE, 0x16F0}, {0x17E0, 0x17E9}, {0x17F0, 0x17F9},
    {0x1810, 0x1819}, {0x1946, 0x194F}, {0x19D0, 0x19DA}, {0x1A80, 0x1A89}, {0x1A90, 0x1A99},
    {0x1B50, 0x1B59}, {0x1BB0, 0x1BB9}, {0x1C40, 0x1C49}, {0x1C50, 0x1C59}, {0x2070, 0x2070},
    {0x2074, 0x2079}, {0x2080, 0x2089}, {0x2150, 0x2182}, {0x2185, 0x2189}, {0x2460, 0x249B},
    {0x24EA, 0x24FF}, {0x2776, 0x2793}, {0x2CFD, 0x2CFD}, {0x3007, 0x3007}, {0x3021, 0x3029},
    {0x3038, 0x303A}, {0x3192, 0x3195}, {0x3220, 0x3229}, {0x3248, 0x324F}, {0x3251, 0x325F},
    {0x3280, 0x3289}, {0x32B1, 0x32BF}, {0xA620, 0xA629}, {0xA6E6, 0xA6EF}, {0xA830, 0xA835},
    {0xA8D0, 0xA8D9}, {0xA900, 0xA909}, {0xA9D0, 0xA9D9}, {0xA9F0, 0xA9F9}, {0xAA50, 0xAA59},
    {0xABF0, 0xABF9}, {0xFF10, 0xFF19}};

bool is_number(uint32_t c) {
  for (const auto& r : kNumberRanges) {
    if (c < r[0]) return false;
    if (c <= r[1]) return true;
  }
  return false;
}

// Letters: see the file comment. Without a UTF-8 locale every non-ASCII character that is not a
// space or a number counts as a letter (main warns).
bool is_letter(uint32_t c, bool have_locale) {
  if (c < 0x80) return (c | 0x20) >= 'a' && (c | 0x20) <= 'z';
  if (!have_locale) return true;
  if (!iswalpha((wint_t)c) || (c >= 0x24B6 && c <= 0x24E9)) return false;  // not circled letters
  bool hangul_jamo = (c >= 0x1160 && c <= 0x11FF) || (c >= 0xD7B0 && c <= 0xD7FF);
  return hangul_jamo || wcwidth((wchar_t)c) != 0;  // width 0: a combining mark
}

CharClass classify(uint32_t c, bool have_locale) {
  if (is_space(c)) return CharClass::Space;
  if (is_number(c)) return CharClass::Number;
  if (is_letter(c, have_locale)) return CharClass::Letter;
  return CharClass::Other;
}

// ---------------------------------------------------------------- GPT-2 pre-tokenization

// Byte offset and class of each code point of `text`, plus an end sentinel.
struct CodePoint {
  size_t offset;
  CharClass cls;
};

std::vector<CodePoint> code_points(const std::string& text, bool have_locale) {
  std::vector<CodePoint> cps;
  for (size_t i = 0; i < text.size();) {
    uint32_t cp;
    size_t len = utf8_decode(text, i, &cp);
    cps.push_back({i, classify(cp, have_locale)});
    i += len;
  }
  cps.push_back({text.size(), CharClass::Other});
  return cps;
}

// Code points matched by 's|'t|'re|'ve|'m|'ll|'d at byte offset `at`, or 0.
size_t contraction_length(const std::string& text, size_t at) {
  static const char* kSuffixes[] = {"s", "t", "re", "ve", "m", "ll", "d"};
  if (text[at] != '\'') return 0;
  for (const char* suffix : kSuffixes) {
    size_t n = std::strlen(suffix);
    if (text.compare(at + 1, n, suffix) == 0) return 1 + n;
  }
  return 0;
}

// Appends the [begin, end) byte ranges of GPT-2's pre-tokens of `text` to `pieces`.
void pretokenize(const std::string& text, bool have_locale,
                 std::vector<std::pair<size_t, size_t>>& pieces) {
  std::vector<CodePoint> cps = code_points(text, have_locale);
  size_t n = cps.size() - 1, i = 0;
  auto run_end = [&](size_t k, CharClass c) {
    while (k < n && cps[k].cls == c) k++;
    return k;
  };
  while (i < n) {
    size_t end = i + contraction_length(text, cps[i].offset);
    if (end == i) {
      // ' ?\p{L}+', ' ?\p{N}+' and ' ?[^\s\p{L}\p{N}]+': an optional ' ' then a run of one class.
      bool space_prefix =
          text[cps[i].offset] == ' ' && i + 1 < n && cps[i + 1].cls != CharClass::Space;
      size_t start = space_prefix ? i + 1 : i;
      if (cps[start].cls != CharClass::Space) {
        end = run_end(start, cps[start].cls);
      } else {
        // '\s+(?!\S)' takes the run but its last space when a non-space follows; '\s+' a lone one.
        size_t j = run_end(i, CharClass::Space);
        end = (j == n || j - i == 1) ? j : j - 1;
      }
    }
    pieces.push_back({cps[i].offset, cps[end].offset});
    i = end;
  }
}

// ---------------------------------------------------------------- vocabularies

uint64_t pair_key(int left, int right) {
  return ((uint64_t)(uint32_t)left << 32) | (uint32_t)right;
}

// GPT-2's bytes_to_unicode(): printable Latin-1 bytes stand for themselves, the other 68 bytes
// for U+0100 upwards in byte order. Returns the inverse: code point -> byte (-1: none).
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
          "%s: '%s' is not in GPT-2's byte-to-unicode alphabet", where, s.c_str());
    bytes += (char)table[cp];
  }
  return bytes;
}

// encoder.json: a flat JSON object of string keys (with \-escapes) to integer values.
struct JsonReader {
  const std::string& text;
  const std::string& name;
  size_t pos = 0;

  [[noreturn]] void fail(const char* what) {
    FATAL("'%s': %s at byte %zu", name.c_str(), what, pos);
  }
  void skip_space() {
    while (pos < text.size() && text[pos] && std::strchr(" \t\r\n", text[pos])) pos++;
  }
  bool eat(char c) {
    skip_space();
    if (pos < text.size() && text[pos] == c) return ++pos, true;
    return false;
  }
  uint32_t hex4() {
    std::string digits = text.substr(pos, 4);
    char* end = nullptr;
    uint32_t v = (uint32_t)std::strtoul(digits.c_str(), &end, 16);
    if (digits.size() != 4 || end != digits.c_str() + 4) fail("bad \\u escape");
    pos += 4;
    return v;
  }
  std::string read_string() {
    if (!eat('"')) fail("expected a string");
    std::string s;
    while (pos < text.size() && text[pos] != '"') {
      char c = text[pos++];
      if (c != '\\') {
        s += c;
        continue;
      }
      if (pos >= text.size()) break;
      static const char kEscapes[] = "\"\\/bfnrt", kEscaped[] = "\"\\/\b\f\n\r\t";
      char e = text[pos++];
      const char* simple = e ? std::strchr(kEscapes, e) : nullptr;
      if (e != 'u' && !simple) fail("bad escape");
      if (e != 'u') {
        s += kEscaped[simple - kEscapes];
        continue;
      }
      uint32_t cp = hex4();
      if (cp >= 0xD800 && cp < 0xDC00 && text.compare(pos, 2, "\\u") == 0) {
        pos += 2;
        uint32_t low = hex4();
        if (low < 0xDC00 || low > 0xDFFF) fail("bad surrogate pair");
        cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
      }
      utf8_append(s, cp);
    }
    if (!eat('"')) fail("unterminated string");
    return s;
  }
  int integer() {
    skip_space();
    char* end = nullptr;
    long v = std::strtol(text.c_str() + pos, &end, 10);
    if (end == text.c_str() + pos || v < 0 || v > INT_MAX) fail("expected a token id");
    pos = end - text.c_str();
    return (int)v;
  }
};

std::vector<std::pair<std::string, int>> read_encoder_json(const std::string& text,
                                                           const std::string& name) {
  JsonReader json{text, name};
  std::vector<std::pair<std::string, int>> entries;
  if (!json.eat('{')) json.fail("expected '{'");
  if (json.eat('}')) return entries;
  do {
    std::string key = json.read_string();
    if (!json.eat(':')) json.fail("expected ':'");
    entries.push_back({key, json.integer()});
  } while (json.eat(','));
  if (!json.eat('}')) json.fail("expected ',' or '}'");
  return entries;
}

int lookup(const std::unordered_map<std::string, int>& ids, const std::string& bytes,
           const char* name, size_t line) {
  auto it = ids.find(bytes);
  CHECK(it != ids.end(), "'%s' line %zu: a token of this merge is not in encoder.json", name, line);
  return it->second;
}

// Fills pieces, eot and byte_token from encoder.json; returns bytes -> token (end-of-text
// excluded, so that the text "<|endoftext|>" is encoded like any other).
std::unordered_map<std::string, int> load_encoder(Gpt2Bpe& v, const std::string& text,
                                                  const char* name, const std::vector<int>& table) {
  std::vector<std::pair<std::string, int>> entries = read_encoder_json(text, name);
  v.pieces.resize(entries.size());
  std::vector<bool> seen(entries.size(), false);
  std::unordered_map<std::string, int> ids;
  for (const auto& [key, id] : entries) {
    CHECK(id < (int)entries.size() && !seen[id],
          "'%s': token ids must be 0..%zu, each once (id %d)", name, entries.size() - 1, id);
    seen[id] = true;
    v.pieces[id] = key == kEotText ? key : unicode_to_bytes(key, table, name);
    if (key == kEotText)
      v.eot = id;
    else
      ids[v.pieces[id]] = id;
  }
  CHECK(v.eot >= 0, "'%s': no %s entry", name, kEotText);
  for (int b = 0; b < 256; b++) {
    auto it = ids.find(std::string(1, (char)b));
    CHECK(it != ids.end(), "'%s': no token for byte %d", name, b);
    v.byte_token[b] = it->second;
  }
  return ids;
}

// vocab.bpe: a "#version" line, then one merge "left right" per line; rank = order.
void load_merges(Gpt2Bpe& v, const std::string& text, const char* name,
                 const std::unordered_map<std::string, int>& ids, const std::vector<int>& table) {
  size_t line = 0, rank = 0;
  for (size_t at = 0; at < text.size();) {
    size_t nl = text.find('\n', at);
    if (nl == std::string::npos) nl = text.size();
    std::string merge = text.substr(at, nl - at);
    at = nl + 1, line++;
    if ((line == 1 && merge.rfind("#version", 0) == 0) || merge.empty()) continue;
    size_t space = merge.find(' ');
    CHECK(space != std::string::npos, "'%s' line %zu: expected 'left right'", name, line);
    std::string left = unicode_to_bytes(merge.substr(0, space), table, name);
    std::string right = unicode_to_bytes(merge.substr(space + 1), table, name);
    int l = lookup(ids, left, name, line), r = lookup(ids, right, name, line);
    v.merges[pair_key(l, r)] = {(int)rank++, lookup(ids, left + right, name, line)};
  }
}

// ---------------------------------------------------------------- encoding

const std::vector<int>& bpe_piece(Gpt2Bpe& v, const std::string& bytes) {
  auto cached = v.cache.find(bytes);
  if (cached != v.cache.end()) return cached->second;
  std::vector<int> word;
  for (unsigned char b : bytes) word.push_back(v.byte_token[b]);
  while (word.size() > 1) {
    const Gpt2Merge* best = nullptr;
    uint64_t best_key = 0;
    for (size_t i = 0; i + 1 < word.size(); i++) {
      auto it = v.merges.find(pair_key(word[i], word[i + 1]));
      if (it != v.merges.end() && (!best || it->second.rank < best->rank))
        best = &it->second, best_key = it->first;
    }
    if (!best) break;
    std::vector<int> merged;
    for (size_t i = 0; i < word.size(); i++) {
      if (i + 1 < word.size() && pair_key(word[i], word[i + 1]) == best_key) {
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

Gpt2Bpe gpt2_bpe_load(const std::string& encoder_json, const char* encoder_name,
                      const std::string& vocab_bpe, const char* bpe_name) {
  Gpt2Bpe v;
  std::vector<int> table = unicode_to_byte_table();
  std::unordered_map<std::string, int> ids = load_encoder(v, encoder_json, encoder_name, table);
  load_merges(v, vocab_bpe, bpe_name, ids, table);
  v.have_locale = setlocale(LC_CTYPE, "C.UTF-8") || setlocale(LC_CTYPE, "C.utf8") ||
                  setlocale(LC_CTYPE, "en_US.UTF-8");
  if (!v.have_locale)
    std::fprintf(stderr,
                 "gpt2_bpe: warning: no UTF-8 locale, non-ASCII characters that are "
                 "neither spaces nor numbers count as letters\n");
  return v;
}

void gpt2_bpe_encode(Gpt2Bpe& bpe, const std::string& text, std::vector<int>& out) {
  std::vector<std::pair<size_t, size_t>> pieces;
  pretokenize(text, bpe.have_locale, pieces);
  for (const auto& [begin, end] : pieces) {
    const std::vector<int>& tokens = bpe_piece(bpe, text.substr(begin, end - begin));
    out.insert(out.end(), tokens.begin(), tokens.end());
  }
}
