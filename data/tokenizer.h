// data/tokenizer.h - decoding token ids to text for printed samples, from llm.c's tokenizer file
// (gpt2_tokenizer.bin: 256 int32 header with magic 20240328, version 2, vocab size, end-of-text
// id; then per token a 1-byte length and its bytes). tools/tokenize writes one for the GPT-2 BPE
// and for the byte-level fallback.
#pragma once
#include <string>
#include <vector>

struct Tokenizer {
  std::vector<std::string> pieces;  // bytes of each token
  int eot = -1;
  bool loaded = false;
};

// Returns false (and leaves tok.loaded false) if the file is missing; exits on a malformed one.
bool tokenizer_load(Tokenizer& tok, const std::string& path);
// Concatenated bytes of the tokens; ids out of range print as "<id>"; non-printable bytes are
// kept (the terminal decides).
std::string tokenizer_decode(const Tokenizer& tok, const int* ids, int n);
