// tools/pretokenize.cpp - GPT-2's and Llama-3's pre-tokenization regexes, written out by hand as
// scanners over the code points: at each position the alternatives are tried in the regex's
// order, and each alternative's backtracking is worked out below, so the pieces are what
// Python's `regex` findall (or Hugging Face's tokenizers) returns.
//
// Character classes: \s is Unicode White_Space (as the `regex` module has it); \p{L} and \p{N}
// are the general categories L* and N*, tables generated from python3's unicodedata
// (tools/unicode_classes.h); code points assigned after that Unicode version count as
// punctuation ("other").
//
// GPT-2:  's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// Llama-3: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//          ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
// Both match at every position (every character is a letter, a number, a space or other), so
// findall's pieces tile the text.
#include "tools/pretokenize.h"

#include <cstring>

#include "tools/unicode_classes.h"

const char* const kGpt2Pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
const char* const kLlama3Pattern =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

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

namespace {

enum class CharClass { Space, Letter, Number, Other };

// Unicode White_Space: what \s matches in Python's `regex` module.
bool is_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

CharClass classify(uint32_t c) {
  if (is_space(c)) return CharClass::Space;
  if (unicode_classes::is_number(c)) return CharClass::Number;
  if (unicode_classes::is_letter(c)) return CharClass::Letter;
  return CharClass::Other;
}

// The text as code points: byte offset, value and class of each, plus an end sentinel.
struct CodePoint {
  size_t offset;
  uint32_t cp;
  CharClass cls;
};

struct Scanner {
  std::vector<CodePoint> cps;
  size_t n = 0;  // code points, without the sentinel

  explicit Scanner(const std::string& text) {
    for (size_t i = 0; i < text.size();) {
      uint32_t cp;
      size_t len = utf8_decode(text, i, &cp);
      cps.push_back({i, cp, classify(cp)});
      i += len;
    }
    n = cps.size();
    cps.push_back({text.size(), 0, CharClass::Other});
  }
  CharClass cls(size_t k) const { return cps[k].cls; }
  bool is_newline(size_t k) const { return k < n && (cps[k].cp == '\r' || cps[k].cp == '\n'); }
  // End of the run of class c starting at k.
  size_t run_end(size_t k, CharClass c) const {
    while (k < n && cps[k].cls == c) k++;
    return k;
  }
  // '\s+(?!\S)|\s+' at the start i of a run of spaces: the run but its last space when a
  // non-space follows (that space then prefixes the next piece), a lone space alone.
  size_t space_run(size_t i) const {
    size_t j = run_end(i, CharClass::Space);
    return (j == n || j - i == 1) ? j : j - 1;
  }
};

// Code points matched by 's|'t|'re|'ve|'m|'ll|'d at code point i, or 0; `any_case` for (?i:...).
size_t contraction(const Scanner& s, size_t i, bool any_case) {
  static const char* kSuffixes[] = {"s", "t", "re", "ve", "m", "ll", "d"};
  if (s.cps[i].cp != '\'') return 0;
  for (const char* suffix : kSuffixes) {
    size_t len = std::strlen(suffix), k = 0;
    for (; k < len && i + 1 + k < s.n; k++) {
      uint32_t c = s.cps[i + 1 + k].cp;
      if (any_case && c == 0x17F) c = 's';  // LONG S case-folds to s
      if (any_case && c >= 'A' && c <= 'Z') c += 'a' - 'A';
      if (c != (uint32_t)suffix[k]) break;
    }
    if (k == len) return 1 + len;
  }
  return 0;
}

// GPT-2: a contraction, or ' ?' then a run of one class, or the space alternatives.
size_t gpt2_piece_end(const Scanner& s, size_t i) {
  size_t len = contraction(s, i, false);
  if (len) return i + len;
  bool space_prefix = s.cps[i].cp == ' ' && i + 1 < s.n && s.cls(i + 1) != CharClass::Space;
  size_t start = space_prefix ? i + 1 : i;
  if (s.cls(start) != CharClass::Space) return s.run_end(start, s.cls(start));
  return s.space_run(i);
}

// Llama-3, alternative by alternative.
size_t llama3_piece_end(const Scanner& s, size_t i) {
  size_t len = contraction(s, i, true);
  if (len) return i + len;
  // [^\r\n\p{L}\p{N}]?\p{L}+ : one optional prefix of anything but newlines, letters, numbers.
  bool prefix = s.cls(i) != CharClass::Letter && s.cls(i) != CharClass::Number && !s.is_newline(i);
  if (s.cls(i) == CharClass::Letter) return s.run_end(i, CharClass::Letter);
  if (prefix && i + 1 < s.n && s.cls(i + 1) == CharClass::Letter)
    return s.run_end(i + 1, CharClass::Letter);
  // \p{N}{1,3}
  if (s.cls(i) == CharClass::Number) {
    size_t end = s.run_end(i, CharClass::Number);
    return end - i > 3 ? i + 3 : end;
  }
  // ' ?[^\s\p{L}\p{N}]+[\r\n]*'
  size_t start = s.cps[i].cp == ' ' && i + 1 < s.n && s.cls(i + 1) == CharClass::Other ? i + 1 : i;
  if (s.cls(start) == CharClass::Other) {
    size_t end = s.run_end(start, CharClass::Other);
    while (s.is_newline(end)) end++;
    return end;
  }
  // '\s*[\r\n]+': the run of spaces up to and including its last newline (backtracking \s*).
  size_t j = s.run_end(i, CharClass::Space), last_newline = j;
  for (size_t k = i; k < j; k++)
    if (s.is_newline(k)) last_newline = k;
  if (last_newline < j) return last_newline + 1;
  return s.space_run(i);
}

}  // namespace

void pretokenize(const std::string& text, SplitPattern pattern,
                 std::vector<std::pair<size_t, size_t>>& pieces) {
  Scanner s(text);
  for (size_t i = 0; i < s.n;) {
    size_t end = pattern == SplitPattern::Gpt2 ? gpt2_piece_end(s, i) : llama3_piece_end(s, i);
    pieces.push_back({s.cps[i].offset, s.cps[end].offset});
    i = end;
  }
}
