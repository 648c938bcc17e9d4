// test/fuzz/fuzz_tokenizer.cpp - the llm.c tokenizer file (data/tokenizer.h): loading it, then
// decoding ids inside and outside its vocabulary.
#include "data/tokenizer.h"
#include "test/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz_catch_stops();
  const std::string path = fuzz_file("tokenizer.bin", data, size);
  try {
    Tokenizer tok;
    if (!tokenizer_load(tok, path)) return 0;
    const int ids[] = {0, 1, tok.eot, (int)tok.pieces.size() - 1, (int)tok.pieces.size(), -1,
                       1 << 30};
    tokenizer_decode(tok, ids, (int)(sizeof(ids) / sizeof(ids[0])));
  } catch (const FuzzStop&) {
  }
  return 0;
}
