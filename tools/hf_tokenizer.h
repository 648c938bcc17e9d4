// tools/hf_tokenizer.h - a Hugging Face tokenizer.json (byte-level BPE: GPT-2's, Llama-3's) read
// into the encoder of tools/bpe.h.
#pragma once
#include <string>

#include "tools/bpe.h"

// Builds the encoder from the contents of tokenizer.json (`name` for error messages). The
// document token is the special token `doc_token` or, when empty, the first special token of
// <|begin_of_text|>, <|endoftext|>, <|end_of_text|> the file has. Anything this encoder would
// not reproduce exactly (another model type or split pattern, a normalizer, byte fallback,
// non-special added tokens, ...) is refused with an error naming it.
ByteLevelBpe hf_tokenizer_load(const std::string& tokenizer_json, const std::string& name,
                               const std::string& doc_token);
