// tools/gpt2_bpe.h - GPT-2's byte-pair encoder, computing what OpenAI's encoder.py computes,
// for tools/tokenize. The method, and its one approximation, are described in gpt2_bpe.cpp.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

struct Gpt2Merge {
  int rank, merged;  // line of vocab.bpe (lower merges first), token the pair becomes
};

struct Gpt2Bpe {
  std::vector<std::string> pieces;  // bytes of each token; end-of-text is "<|endoftext|>"
  int eot = -1;
  std::array<int, 256> byte_token{};                        // token of each single byte
  std::unordered_map<uint64_t, Gpt2Merge> merges;           // (left, right) token pair -> merge
  std::unordered_map<std::string, std::vector<int>> cache;  // pre-token bytes -> tokens
  bool have_locale = false;  // a UTF-8 LC_CTYPE locale classifies non-ASCII letters
};

// Builds the encoder from the contents of encoder.json and vocab.bpe (the names are for error
// messages) and switches LC_CTYPE to C.UTF-8 for the letter classes (warns if it cannot).
Gpt2Bpe gpt2_bpe_load(const std::string& encoder_json, const char* encoder_name,
                      const std::string& vocab_bpe, const char* bpe_name);
// Appends the tokens of `text` (any bytes; invalid UTF-8 is encoded byte by byte) to `out`.
void gpt2_bpe_encode(Gpt2Bpe& bpe, const std::string& text, std::vector<int>& out);
