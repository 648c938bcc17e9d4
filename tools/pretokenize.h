// tools/pretokenize.h - the pre-tokenization of byte-level BPE tokenizers: text cut into pieces
// by GPT-2's or Llama-3's split regex (tools/pretokenize.cpp), each later encoded on its own.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

enum class SplitPattern { Gpt2, Llama3 };

// GPT-2's and Llama-3's patterns, exactly as tokenizer.json files spell them (the only two this
// tool implements; tools/hf_tokenizer.cpp refuses any other).
extern const char* const kGpt2Pattern;
extern const char* const kLlama3Pattern;

// Decodes the UTF-8 code point at s[i] into *cp and returns its length; a malformed sequence
// yields one byte with code point U+FFFD.
size_t utf8_decode(const std::string& s, size_t i, uint32_t* cp);
// Appends the [begin, end) byte ranges of the pre-tokens of `text` to `pieces`. Every byte of
// the text lies in exactly one piece (invalid UTF-8 bytes count as punctuation).
void pretokenize(const std::string& text, SplitPattern pattern,
                 std::vector<std::pair<size_t, size_t>>& pieces);
