// tools/json.cpp - the strict JSON reader of tools/json.h: recursive descent over the text, one
// function per JSON production.
#include "tools/json.h"

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "kernels/common.h"

namespace {

struct JsonParser {
  const std::string& text;
  const std::string& name;
  size_t pos = 0;
  int depth = 0;

  [[noreturn]] void fail(const char* what) {
    FATAL("'%s': %s at byte %zu", name.c_str(), what, pos);
  }
  void skip_space() {
    while (pos < text.size() && std::strchr(" \t\r\n", text[pos]) && text[pos]) pos++;
  }
  bool eat(char c) {
    skip_space();
    if (pos < text.size() && text[pos] == c) return ++pos, true;
    return false;
  }
  bool eat_word(const char* w) {
    size_t n = std::strlen(w);
    if (text.compare(pos, n, w) != 0) return false;
    pos += n;
    return true;
  }
  uint32_t hex4() {
    std::string digits = text.substr(pos, 4);
    char* end = nullptr;
    uint32_t v = (uint32_t)std::strtoul(digits.c_str(), &end, 16);
    if (digits.size() != 4 || end != digits.c_str() + 4) fail("bad \\u escape");
    pos += 4;
    return v;
  }
  uint32_t escaped_code_point() {
    uint32_t cp = hex4();
    if (cp >= 0xDC00 && cp < 0xE000) fail("lone low surrogate");
    if (cp < 0xD800 || cp >= 0xDC00) return cp;
    if (text.compare(pos, 2, "\\u") != 0) fail("lone high surrogate");
    pos += 2;
    uint32_t low = hex4();
    if (low < 0xDC00 || low > 0xDFFF) fail("bad surrogate pair");
    return 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
  }
  std::string string_body() {
    if (!eat('"')) fail("expected a string");
    std::string s;
    while (pos < text.size() && text[pos] != '"') {
      char c = text[pos++];
      if ((unsigned char)c < 0x20) fail("control character in a string");
      if (c != '\\') {
        s += c;
        continue;
      }
      if (pos >= text.size()) break;
      static const char kEscapes[] = "\"\\/bfnrt", kEscaped[] = "\"\\/\b\f\n\r\t";
      char e = text[pos++];
      const char* simple = e ? std::strchr(kEscapes, e) : nullptr;
      if (e == 'u')
        utf8_append(s, escaped_code_point());
      else if (simple)
        s += kEscaped[simple - kEscapes];
      else
        fail("bad escape");
    }
    if (pos >= text.size()) fail("unterminated string");
    pos++;
    return s;
  }
  double number() {
    const char* start = text.c_str() + pos;
    char* end = nullptr;
    double v = std::strtod(start, &end);
    bool json_start = *start == '-' || (*start >= '0' && *start <= '9');
    if (end == start || !json_start) fail("expected a value");
    pos += end - start;
    return v;
  }
  JsonValue value() {
    if (++depth > 64) fail("nested too deeply");
    skip_space();
    JsonValue v;
    char c = pos < text.size() ? text[pos] : '\0';
    if (c == '{') {
      v.type = JsonValue::Object;
      pos++;
      if (!eat('}')) {
        do {
          skip_space();
          v.keys.push_back(string_body());
          if (!eat(':')) fail("expected ':'");
          v.items.push_back(value());
        } while (eat(','));
        if (!eat('}')) fail("expected ',' or '}'");
      }
    } else if (c == '[') {
      v.type = JsonValue::Array;
      pos++;
      if (!eat(']')) {
        do v.items.push_back(value());
        while (eat(','));
        if (!eat(']')) fail("expected ',' or ']'");
      }
    } else if (c == '"') {
      v.type = JsonValue::String;
      v.text = string_body();
    } else if (eat_word("true") || eat_word("false")) {
      v.type = JsonValue::Bool;
      v.boolean = text[pos - 1] == 'e' && text[pos - 2] == 'u';
    } else if (eat_word("null")) {
      v.type = JsonValue::Null;
    } else {
      v.type = JsonValue::Number;
      v.number = number();
    }
    depth--;
    return v;
  }
};

}  // namespace

const JsonValue* JsonValue::get(const std::string& key) const {
  if (type != Object) return nullptr;
  for (size_t i = 0; i < keys.size(); i++)
    if (keys[i] == key) return &items[i];
  return nullptr;
}

JsonValue json_parse(const std::string& text, const std::string& name) {
  JsonParser p{text, name};
  JsonValue v = p.value();
  p.skip_space();
  if (p.pos != text.size()) p.fail("unexpected text after the JSON value");
  return v;
}

long long json_integer(const JsonValue& v, long long lo, long long hi) {
  bool ok = v.type == JsonValue::Number && v.number == std::floor(v.number) && v.number >= lo &&
            v.number <= hi;
  return ok ? (long long)v.number : -1;
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
