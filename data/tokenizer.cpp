// data/tokenizer.cpp - reads llm.c's tokenizer file and turns token ids back into bytes for the
// samples the trainer prints (format in data/tokenizer.h). Runs on the host, single-threaded;
// decoding is a table lookup per token. Version 1 files (no end-of-text id in the header) are
// read as llm.c reads them, with end-of-text 50256.
#include "data/tokenizer.h"

#include <cstdint>
#include <cstdio>
#include <memory>

#include "kernels/common.h"

namespace {
constexpr int32_t kTokenizerMagic = 20240328;
constexpr int kGpt2Eot = 50256;
}  // namespace

bool tokenizer_load(Tokenizer& tok, const std::string& path) {
  tok = Tokenizer();
  std::unique_ptr<FILE, int (*)(FILE*)> file(std::fopen(path.c_str(), "rb"), std::fclose);
  FILE* f = file.get();
  if (!f) return false;
  int32_t header[256];
  CHECK_ALL(std::fread(header, sizeof(header), 1, f) == 1,
            "tokenizer '%s': shorter than the 1024-byte header", path.c_str());
  CHECK_ALL(header[0] == kTokenizerMagic, "tokenizer '%s': bad magic %d, expected %d", path.c_str(),
            header[0], kTokenizerMagic);
  CHECK_ALL(header[1] == 1 || header[1] == 2, "tokenizer '%s': bad version %d, expected 1 or 2",
            path.c_str(), header[1]);
  int vocab = header[2];
  std::fseek(f, 0, SEEK_END);
  const long bytes = std::ftell(f);
  std::fseek(f, sizeof(header), SEEK_SET);
  // Each token takes at least two bytes (its length and one byte), so the file bounds the
  // vocabulary before anything is allocated for it.
  CHECK_ALL(vocab > 0 && vocab <= (bytes - (long)sizeof(header)) / 2,
            "tokenizer '%s': bad vocabulary size %d for a file of %ld bytes", path.c_str(), vocab,
            bytes);
  tok.eot = header[1] == 1 ? kGpt2Eot : header[3];
  tok.pieces.resize(vocab);
  for (int i = 0; i < vocab; i++) {
    unsigned char len = 0;
    CHECK_ALL(std::fread(&len, 1, 1, f) == 1 && len > 0,
              "tokenizer '%s': token %d of %d is truncated or empty", path.c_str(), i, vocab);
    tok.pieces[i].resize(len);
    CHECK_ALL(std::fread(&tok.pieces[i][0], 1, len, f) == len,
              "tokenizer '%s': token %d of %d is truncated", path.c_str(), i, vocab);
  }
  tok.loaded = true;
  return true;
}

std::string tokenizer_decode(const Tokenizer& tok, const int* ids, int n) {
  std::string text;
  for (int i = 0; i < n; i++) {
    int id = ids[i];
    if (id >= 0 && id < (int)tok.pieces.size()) {
      text += tok.pieces[id];
    } else {
      text += "<" + std::to_string(id) + ">";
    }
  }
  return text;
}
