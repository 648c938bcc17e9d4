// tools/bpe.h - a byte-level BPE tokenizer (GPT-2's, Llama-3's): pre-tokenization by a split
// regex (tools/pretokenize.h), then byte-pair merges by rank inside each piece. Loaded from
// OpenAI's encoder.json + vocab.bpe (tools/gpt2_bpe.cpp) or a Hugging Face tokenizer.json
// (tools/hf_tokenizer.cpp); encoding is in tools/bpe.cpp.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "config/json.h"
#include "tools/pretokenize.h"

struct BpeMerge {
  int rank, merged;  // order of the merge (lower merges first), token the pair becomes
};

struct ByteLevelBpe {
  std::vector<std::string> pieces;  // bytes of each token; special tokens hold their text
  std::vector<bool> special;        // special (added) tokens: never produced from text
  int doc_token = -1;               // written before each document
  SplitPattern pattern = SplitPattern::Gpt2;
  bool ignore_merges = false;  // a piece that is itself a vocabulary entry is that one token
  std::array<int, 256> byte_token{};                       // token of each single byte
  std::unordered_map<std::string, int> ids;                // bytes -> ordinary (not special) token
  std::unordered_map<uint64_t, BpeMerge> merges;           // (left, right) token pair -> merge
  std::unordered_map<std::string, std::vector<int>> cache;  // piece bytes -> tokens
};

// GPT-2's bytes_to_unicode() inverted: code point -> byte, -1 for none. Vocabulary files spell
// bytes through it: printable Latin-1 bytes stand for themselves, the other 68 for U+0100 up.
std::vector<int> unicode_to_byte_table();
// The bytes a vocabulary string spells; stops with an error naming `where` when a character is
// outside the alphabet.
std::string unicode_to_bytes(const std::string& s, const std::vector<int>& table, const char* where);
uint64_t bpe_pair_key(int left, int right);
// The vocabulary files' JSON (config/json.h); a malformed file stops with an error naming it.
JsonValue json_parse_or_die(const std::string& text, const std::string& name);
// The token id a JSON value holds, 0..max, or -1 when it holds none.
long long json_id(const JsonValue& v, long long max);
// Fills byte_token from `ids`, failing (naming `where`) when a byte has no token.
void bpe_set_byte_tokens(ByteLevelBpe& bpe, const char* where);
// Appends the tokens of `text` (any bytes; invalid UTF-8 is encoded byte by byte) to `out`.
// Special tokens' texts inside `text` are encoded as ordinary text.
void bpe_encode(ByteLevelBpe& bpe, const std::string& text, std::vector<int>& out);
