// tools/gpt2_bpe.h - GPT-2's byte-pair encoder from OpenAI's encoder.json and vocab.bpe, the
// same ids as OpenAI's encoder.py (the encoding itself is tools/bpe.cpp's).
#pragma once
#include <string>

#include "tools/bpe.h"

// Builds the encoder from the contents of encoder.json and vocab.bpe (the names are for error
// messages). The document token is <|endoftext|>.
ByteLevelBpe gpt2_bpe_load(const std::string& encoder_json, const char* encoder_name,
                           const std::string& vocab_bpe, const char* bpe_name);
