// config/json.cu - the strict JSON reader of config/json.h: a recursive-descent parser over the
// bytes, one function per grammar rule. Errors are thrown as a JsonError carrying the byte offset
// and caught at the top, so the rules stay short.
#include "config/json.h"

#include <sys/stat.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unordered_set>

namespace {

struct JsonError {
  size_t offset;
  std::string what;
};

constexpr int kMaxDepth = 64;

struct Parser {
  const std::string& s;
  size_t base = 0;  // added to every offset reported
  size_t i = 0;

  [[noreturn]] void fail(const std::string& what, size_t at) { throw JsonError{base + at, what}; }
  [[noreturn]] void fail(const std::string& what) { fail(what, i); }
  bool done() const { return i >= s.size(); }
  char peek() const { return done() ? '\0' : s[i]; }
  void skip_space() {
    while (!done() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r')) i++;
  }
  void expect(char c, const char* what) {
    if (peek() != c) fail(std::string("expected ") + what + describe_here());
    i++;
  }
  std::string describe_here() const {
    if (done()) return ", found the end of the text";
    const unsigned char c = s[i];
    char buf[48];
    if (c >= 0x20 && c < 0x7f) std::snprintf(buf, sizeof buf, ", found '%c'", c);
    else std::snprintf(buf, sizeof buf, ", found byte 0x%02x", c);
    return buf;
  }

  JsonValue value(int depth);
  void literal(const char* word, JsonValue& v);
  void number(JsonValue& v);
  std::string string();
  unsigned hex4();
  void append_utf8(std::string& out, unsigned cp);
  void array(JsonValue& v, int depth);
  void object(JsonValue& v, int depth);
};

JsonValue Parser::value(int depth) {
  if (depth > kMaxDepth) fail("nesting deeper than 64 levels");
  skip_space();
  JsonValue v;
  v.offset = base + i;
  switch (peek()) {
    case '{': object(v, depth); break;
    case '[': array(v, depth); break;
    case '"': v.kind = JsonValue::String, v.text = string(); break;
    case 't': literal("true", v); break;
    case 'f': literal("false", v); break;
    case 'n': literal("null", v); break;
    default:
      if (peek() == '-' || (peek() >= '0' && peek() <= '9')) number(v);
      else fail("expected a value" + describe_here());
  }
  return v;
}

void Parser::literal(const char* word, JsonValue& v) {
  const size_t n = std::strlen(word);
  if (s.compare(i, n, word) != 0) fail("expected a value" + describe_here());
  i += n;
  v.kind = word[0] == 'n' ? JsonValue::Null : JsonValue::Bool;
  v.boolean = word[0] == 't';
}

// -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
void Parser::number(JsonValue& v) {
  const size_t start = i;
  auto digits = [&]() {
    const size_t first = i;
    while (!done() && s[i] >= '0' && s[i] <= '9') i++;
    if (i == first) fail("expected a digit" + describe_here());
  };
  if (peek() == '-') i++;
  if (peek() == '0') {
    i++;
    if (peek() >= '0' && peek() <= '9') fail("a number has a leading zero", start);
  } else {
    digits();
  }
  bool integral = true;
  if (peek() == '.') i++, digits(), integral = false;
  if (peek() == 'e' || peek() == 'E') {
    i++;
    if (peek() == '+' || peek() == '-') i++;
    digits();
    integral = false;
  }
  const std::string span = s.substr(start, i - start);
  v.kind = JsonValue::Number;
  v.number = std::strtod(span.c_str(), nullptr);
  if (!std::isfinite(v.number)) fail("number out of range", start);
  if (integral) {
    errno = 0;
    long long n = std::strtoll(span.c_str(), nullptr, 10);
    v.is_integer = errno == 0;
    v.integer = n;
  }
}

unsigned Parser::hex4() {
  unsigned cp = 0;
  for (int k = 0; k < 4; k++, i++) {
    const char c = peek();
    int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
          : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    if (d < 0) fail("expected 4 hex digits after \\u" + describe_here());
    cp = cp * 16 + d;
  }
  return cp;
}

void Parser::append_utf8(std::string& out, unsigned cp) {
  if (cp < 0x80) {
    out += (char)cp;
  } else if (cp < 0x800) {
    out += (char)(0xC0 | (cp >> 6)), out += (char)(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += (char)(0xE0 | (cp >> 12)), out += (char)(0x80 | ((cp >> 6) & 0x3F));
    out += (char)(0x80 | (cp & 0x3F));
  } else {
    out += (char)(0xF0 | (cp >> 18)), out += (char)(0x80 | ((cp >> 12) & 0x3F));
    out += (char)(0x80 | ((cp >> 6) & 0x3F)), out += (char)(0x80 | (cp & 0x3F));
  }
}

std::string Parser::string() {
  expect('"', "'\"'");
  std::string out;
  while (true) {
    if (done()) fail("unterminated string");
    const unsigned char c = s[i];
    if (c == '"') break;
    if (c < 0x20) fail("control character inside a string" + describe_here());
    if (c != '\\') {
      out += (char)c, i++;
      continue;
    }
    const size_t at = i++;
    const char e = peek();
    i++;
    switch (e) {
      case '"': out += '"'; break;
      case '\\': out += '\\'; break;
      case '/': out += '/'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'n': out += '\n'; break;
      case 'r': out += '\r'; break;
      case 't': out += '\t'; break;
      case 'u': {
        unsigned cp = hex4();
        if (cp >= 0xDC00 && cp < 0xE000) fail("lone low surrogate in \\u escape", at);
        if (cp >= 0xD800 && cp < 0xDC00) {
          if (s.compare(i, 2, "\\u") != 0) fail("high surrogate without its low half", at);
          i += 2;
          const unsigned lo = hex4();
          if (lo < 0xDC00 || lo >= 0xE000) fail("high surrogate without its low half", at);
          cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        }
        append_utf8(out, cp);
        break;
      }
      default: fail("unknown escape in a string", at);
    }
  }
  i++;
  return out;
}

void Parser::array(JsonValue& v, int depth) {
  v.kind = JsonValue::Array;
  expect('[', "'['");
  skip_space();
  if (peek() == ']') {
    i++;
    return;
  }
  while (true) {
    v.items.push_back(value(depth + 1));
    skip_space();
    if (peek() == ']') break;
    expect(',', "',' or ']' in an array");
  }
  i++;
}

void Parser::object(JsonValue& v, int depth) {
  v.kind = JsonValue::Object;
  expect('{', "'{'");
  skip_space();
  if (peek() == '}') {
    i++;
    return;
  }
  std::unordered_set<std::string> keys;  // a tokenizer.json's vocabulary has 128k members
  while (true) {
    skip_space();
    const size_t at = i;
    if (peek() != '"') fail("expected a string key" + describe_here());
    std::string key = string();
    if (!keys.insert(key).second) fail("key \"" + key + "\" appears twice in one object", at);
    skip_space();
    expect(':', "':' after a key");
    v.members.emplace_back(std::move(key), value(depth + 1));
    skip_space();
    if (peek() == '}') break;
    expect(',', "',' or '}' in an object");
  }
  i++;
}

}  // namespace

const JsonValue* JsonValue::find(const std::string& key) const {
  for (const auto& m : members)
    if (m.first == key) return &m.second;
  return nullptr;
}

const char* JsonValue::kind_name() const {
  static const char* names[] = {"null", "a boolean", "a number", "a string", "an array",
                                "an object"};
  return names[kind];
}

std::string json_parse(const std::string& text, JsonValue* out, size_t base) {
  Parser p{text, base};
  try {
    JsonValue v = p.value(0);
    p.skip_space();
    if (!p.done()) p.fail("text after the end of the JSON value" + p.describe_here());
    *out = std::move(v);
    return "";
  } catch (const JsonError& e) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "byte %zu: ", e.offset);
    return buf + e.what;
  }
}

std::string json_parse_file(const std::string& path, JsonValue* out, size_t max_bytes) {
  struct stat st;  // before opening: a FIFO would block the open
  if (stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
    return path + ": a directory, not a JSON file";
  if (stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
    return path + ": not a regular file (a device, FIFO or socket), not a JSON file";
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return path + ": cannot open: " + std::strerror(errno);
  std::string text;
  char buf[1 << 16];
  size_t got;
  while ((got = std::fread(buf, 1, sizeof buf, f)) > 0) {
    text.append(buf, got);
    if (text.size() > max_bytes) {
      std::fclose(f);
      return path + ": larger than " + std::to_string(max_bytes) + " bytes, not a JSON file "
             "this reader expects";
    }
  }
  std::fclose(f);
  const std::string err = json_parse(text, out);
  return err.empty() ? "" : path + ": " + err;
}
