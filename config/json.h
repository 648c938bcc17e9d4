// config/json.h - a small strict JSON reader, for the files a Hugging Face model directory holds
// (config.json, model.safetensors.index.json, the header of each .safetensors file).
//
// Strict RFC 8259: one value and nothing after it but whitespace; no comments, trailing commas,
// single quotes, NaN/Infinity, leading zeros, control characters inside strings or unknown
// escapes; \uXXXX escapes (surrogate pairs included) become UTF-8; a key given twice in one
// object is an error (Hugging Face's files never repeat one, and which one wins would be a
// guess). Nesting is limited to 64 levels so that a hostile file cannot exhaust the stack.
// Every error says the byte offset where the text stops making sense.
//
// It lives in config/ (the bottom layer) because the config reader checks [model] against a
// config.json before anything else runs; checkpoint/safetensors.cu uses it too.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

struct JsonValue {
  enum Kind { Null, Bool, Number, String, Array, Object };
  Kind kind = Null;
  bool boolean = false;
  double number = 0;        // Number
  bool is_integer = false;  // Number written without fraction or exponent, fits int64
  int64_t integer = 0;      //   ... and its exact value
  std::string text;         // String (UTF-8)
  std::vector<JsonValue> items;                             // Array
  std::vector<std::pair<std::string, JsonValue>> members;   // Object, in file order
  size_t offset = 0;        // byte offset of the value's first character

  const JsonValue* find(const std::string& key) const;  // Object member, or nullptr
  const char* kind_name() const;                        // "string", "object", ...
};

// Parses all of `text`. Returns "" and fills *out, or "byte N: what is wrong". Offsets (in the
// message and in each value) count from `base`: the text's position in its file.
std::string json_parse(const std::string& text, JsonValue* out, size_t base = 0);
// Reads and parses a whole file; returns "" or "PATH: byte N: what is wrong" (or why it could
// not be read). Files over max_bytes are refused unread.
std::string json_parse_file(const std::string& path, JsonValue* out,
                            size_t max_bytes = 64u << 20);
