// tools/json.h - a small strict JSON reader for the tokenizer files (encoder.json,
// tokenizer.json): the whole text becomes a tree of JsonValue. Errors name the file and the byte
// offset. Strings are UTF-8 (\u escapes and surrogate pairs decoded); numbers are doubles.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

struct JsonValue {
  enum Type { Null, Bool, Number, String, Array, Object } type = Null;
  bool boolean = false;
  double number = 0;
  std::string text;              // String
  std::vector<JsonValue> items;  // Array elements, or Object values (in file order)
  std::vector<std::string> keys; // Object keys, keys[i] names items[i]

  // The member named `key` of an object, or nullptr (also when this is not an object).
  const JsonValue* get(const std::string& key) const;
  bool is_null() const { return type == Null; }
};

// Parses `text` (the contents of the file `name`); stops with an error on malformed input.
JsonValue json_parse(const std::string& text, const std::string& name);
// The integer in lo..hi that `v` holds, or -1 when it is not one (not a number, fractional, out
// of range).
long long json_integer(const JsonValue& v, long long lo, long long hi);
// Appends the UTF-8 encoding of code point cp to s.
void utf8_append(std::string& s, uint32_t cp);
