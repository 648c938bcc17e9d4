// tools/tokenize.cpp - text files in, llm.c token shards out (and back again, for tests).
//
//   tokenize encode (--tokenizer tokenizer.json [--doc-token TEXT] |
//                    --encoder encoder.json --bpe vocab.bpe | --byte-level) --out DIR
//            [--name NAME] [--val-docs N] [--shard-tokens N] [--doc-sep percent|none] FILE...
//   tokenize decode --tokenizer DIR/tokenizer.bin FILE.bin
//
// encode: documents are separated by lines holding only "%" (the fortune format; entries of only
// whitespace are dropped) or, with --doc-sep none, are whole files (in argument order). Each is
// encoded after the document token, as llm.c's datasets are. The first --val-docs documents go
// to DIR/NAME_val_*.bin, the rest to DIR/NAME_train_*.bin, cut into ceil(n / --shard-tokens)
// shards of near-equal size (so that no tail shard is too small to load). The shard format is
// llm.c's: a 1024-byte header (magic, version, token count), then the tokens, little-endian:
// GPT-2's (magic 20240520, version 1, uint16) when every id fits 16 bits (vocabularies up to
// 65536), Llama-3's (magic 20240801, version 7, uint32) otherwise. Also written:
// DIR/tokenizer.bin (llm.c tokenizer format, version 2, for decoding samples) and DIR/vocab_size
// (a text file).
//
// Tokenizers:
//   --tokenizer tokenizer.json  a Hugging Face byte-level BPE (GPT-2's or Llama-3's split pattern,
//                               tools/hf_tokenizer.cpp); the document token is <|begin_of_text|>
//                               (Llama-3, llm.c's choice), else <|endoftext|> or <|end_of_text|>,
//                               or the special token --doc-token names.
//   --encoder/--bpe             GPT-2 BPE from OpenAI's files (tools/gpt2_bpe.cpp, the same ids
//                               as encoder.py); document token <|endoftext|>.
//   --byte-level                token = byte value, 256 = end-of-text, vocabulary 257.
// Special tokens' texts inside documents are encoded as ordinary text.
//
// decode prints a shard's text through tokenizer.bin (the tests round-trip through it).
// Single-threaded; all tokens are held in memory (4 bytes each) so that shards can be cut evenly:
// this is for small corpora (fortunes: 2.8 MB of text, about a second). Prepare web-scale data
// with llm.c's Python scripts; the trainer reads both.
#include <errno.h>
#include <glob.h>
#include <sys/stat.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/common.h"
#include "tools/gpt2_bpe.h"
#include "tools/hf_tokenizer.h"

namespace {

constexpr int32_t kShardMagic = 20240520, kShardVersion = 1;        // uint16 tokens
constexpr int32_t kShardMagicU32 = 20240801, kShardVersionU32 = 7;  // uint32 tokens
constexpr int32_t kTokenizerMagic = 20240328, kTokenizerVersion = 2;

// ---------------------------------------------------------------- files

std::string read_file(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "rb");
  CHECK(f, "cannot open '%s': %s", path.c_str(), std::strerror(errno));
  std::string text;
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) text.append(buf, n);
  std::fclose(f);
  return text;
}

void write_file(const std::string& path, const std::string& bytes) {
  FILE* f = std::fopen(path.c_str(), "wb");
  CHECK(f, "cannot create '%s': %s", path.c_str(), std::strerror(errno));
  CHECK(std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size() && std::fclose(f) == 0,
        "cannot write '%s': %s", path.c_str(), std::strerror(errno));
}

void make_dirs(const std::string& dir) {
  for (size_t i = 1; i <= dir.size(); i++) {
    if (i < dir.size() && dir[i] != '/') continue;
    std::string prefix = dir.substr(0, i);
    CHECK(mkdir(prefix.c_str(), 0755) == 0 || errno == EEXIST, "cannot create directory '%s': %s",
          prefix.c_str(), std::strerror(errno));
  }
}

std::string header_bytes(int32_t a, int32_t b, int32_t c, int32_t d) {
  int32_t header[256] = {a, b, c, d};
  return std::string((const char*)header, sizeof(header));
}

// ---------------------------------------------------------------- encoding

struct Encoder {
  std::string kind;                 // "byte-level", "GPT-2 BPE", "tokenizer.json (...)"
  bool byte_level = false;
  ByteLevelBpe bpe;                 // BPE only
  std::vector<std::string> pieces;  // bytes of each token, for tokenizer.bin
  int eot = -1;                     // the document token
};

struct Options {
  std::string encoder, bpe, hf_tokenizer, doc_token, out, name = "fortunes", tokenizer,
      doc_sep = "percent";
  bool byte_level = false;
  int64_t val_docs = 0, shard_tokens = 100000000;
  std::vector<std::string> files;
};

Encoder make_encoder(const Options& o) {
  Encoder e;
  e.byte_level = o.byte_level;
  if (o.byte_level) {
    for (int b = 0; b < 256; b++) e.pieces.push_back(std::string(1, (char)b));
    e.pieces.push_back("<|endoftext|>");
    e.eot = 256;
    e.kind = "byte-level";
    return e;
  }
  if (!o.hf_tokenizer.empty()) {
    e.bpe = hf_tokenizer_load(read_file(o.hf_tokenizer), o.hf_tokenizer, o.doc_token);
    e.kind = std::string("tokenizer.json, ") +
             (e.bpe.pattern == SplitPattern::Llama3 ? "Llama-3" : "GPT-2") + " split pattern";
  } else {
    e.bpe = gpt2_bpe_load(read_file(o.encoder), o.encoder.c_str(), read_file(o.bpe),
                          o.bpe.c_str());
    e.kind = "GPT-2 BPE";
  }
  e.pieces = e.bpe.pieces;
  e.eot = e.bpe.doc_token;
  return e;
}

void encode_document(Encoder& e, const std::string& doc, std::vector<uint32_t>& out) {
  out.push_back((uint32_t)e.eot);
  if (e.byte_level) {
    for (unsigned char b : doc) out.push_back(b);
    return;
  }
  std::vector<int> tokens;
  bpe_encode(e.bpe, doc, tokens);
  for (int t : tokens) out.push_back((uint32_t)t);
}

bool only_whitespace(const std::string& s) {
  return s.find_first_not_of(" \t\r\n\v\f") == std::string::npos;
}

// Documents of a file: split at lines holding only "%" (fortune format; whitespace-only entries
// are dropped), or the whole file (unless empty).
void split_documents(const std::string& text, bool percent_separated,
                     std::vector<std::string>& docs) {
  if (!percent_separated) {
    if (!text.empty()) docs.push_back(text);
    return;
  }
  std::string doc;
  for (size_t at = 0; at < text.size();) {
    size_t nl = text.find('\n', at);
    size_t end = nl == std::string::npos ? text.size() : nl + 1;
    std::string line = text.substr(at, end - at);
    at = end;
    if (line == "%" || line == "%\n" || line == "%\r\n") {
      if (!only_whitespace(doc)) docs.push_back(doc);
      doc.clear();
    } else {
      doc += line;
    }
  }
  if (!only_whitespace(doc)) docs.push_back(doc);
}

// ---------------------------------------------------------------- output

// Writes tokens as ceil(n / shard_tokens) shards of near-equal size; returns how many.
// Tokens are uint16 (GPT-2's format) when `wide` is false, else uint32 (Llama-3's).
int write_shards(const std::string& dir, const std::string& name, const char* split,
                 const std::vector<uint32_t>& tokens, int64_t shard_tokens, bool wide) {
  int64_t n = (int64_t)tokens.size(), shards = (n + shard_tokens - 1) / shard_tokens;
  for (int64_t k = 0; k < shards; k++) {
    int64_t begin = n * k / shards, end = n * (k + 1) / shards;
    char path[4096];
    std::snprintf(path, sizeof(path), "%s/%s_%s_%06lld.bin", dir.c_str(), name.c_str(), split,
                  (long long)k);
    std::string bytes = wide ? header_bytes(kShardMagicU32, kShardVersionU32, (int32_t)(end - begin), 0)
                             : header_bytes(kShardMagic, kShardVersion, (int32_t)(end - begin), 0);
    for (int64_t i = begin; i < end; i++) {
      uint32_t t = tokens[i];
      bytes.append((const char*)&t, wide ? 4 : 2);  // little-endian hosts only
    }
    write_file(path, bytes);
  }
  return (int)shards;
}

void write_tokenizer(const std::string& path, const std::vector<std::string>& pieces, int eot) {
  std::string bytes = header_bytes(kTokenizerMagic, kTokenizerVersion, (int32_t)pieces.size(), eot);
  for (const std::string& piece : pieces) {
    CHECK(!piece.empty() && piece.size() < 256,
          "token of %zu bytes does not fit the tokenizer file", piece.size());
    bytes += (char)piece.size();
    bytes += piece;
  }
  write_file(path, bytes);
}

bool any_file_matches(const std::string& pattern) {
  glob_t g;
  bool found = glob(pattern.c_str(), 0, nullptr, &g) == 0 && g.gl_pathc > 0;
  globfree(&g);
  return found;
}

// ---------------------------------------------------------------- commands

[[noreturn]] void usage() {
  std::fprintf(
      stderr,
      "usage: tokenize encode (--tokenizer tokenizer.json [--doc-token TEXT] |\n"
      "                        --encoder encoder.json --bpe vocab.bpe | --byte-level) --out DIR\n"
      "                [--name NAME] [--val-docs N] [--shard-tokens N] [--doc-sep percent|none] "
      "FILE...\n"
      "       tokenize decode --tokenizer tokenizer.bin FILE.bin\n");
  std::exit(2);
}

int64_t parse_count(const char* flag, const char* text) {
  char* end = nullptr;
  long long v = std::strtoll(text, &end, 10);
  CHECK(*text && !*end && v >= 0, "%s expects a non-negative integer, got '%s'", flag, text);
  return v;
}

Options parse_options(int argc, char** argv) {
  Options o;
  for (int i = 2; i < argc; i++) {
    std::string a = argv[i];
    bool has_value = i + 1 < argc;
    if (a == "--byte-level")
      o.byte_level = true;
    else if (a.rfind("--", 0) == 0 && !has_value)
      usage();
    else if (a == "--encoder")
      o.encoder = argv[++i];
    else if (a == "--bpe")
      o.bpe = argv[++i];
    else if (a == "--out")
      o.out = argv[++i];
    else if (a == "--name")
      o.name = argv[++i];
    else if (a == "--tokenizer")
      o.tokenizer = argv[++i];
    else if (a == "--doc-token")
      o.doc_token = argv[++i];
    else if (a == "--doc-sep")
      o.doc_sep = argv[++i];
    else if (a == "--val-docs")
      o.val_docs = parse_count("--val-docs", argv[++i]);
    else if (a == "--shard-tokens")
      o.shard_tokens = parse_count("--shard-tokens", argv[++i]);
    else if (a.rfind("--", 0) == 0)
      usage();
    else
      o.files.push_back(a);
  }
  return o;
}

int encode_command(Options o) {
  o.hf_tokenizer = o.tokenizer;  // encode's --tokenizer is a tokenizer.json
  bool gpt2_files = !o.encoder.empty() || !o.bpe.empty();
  int sources = o.byte_level + gpt2_files + !o.hf_tokenizer.empty();
  if (o.out.empty() || o.files.empty() || sources != 1) usage();
  if (gpt2_files && (o.encoder.empty() || o.bpe.empty())) usage();
  if (!o.doc_token.empty() && o.hf_tokenizer.empty()) usage();
  if (o.doc_sep != "percent" && o.doc_sep != "none") usage();
  CHECK(o.shard_tokens > 0 && o.shard_tokens <= INT32_MAX, "--shard-tokens must be 1..%d",
        INT32_MAX);
  Encoder e = make_encoder(o);
  bool wide = e.pieces.size() > 65536;
  std::vector<std::string> docs;
  for (const std::string& file : o.files)
    split_documents(read_file(file), o.doc_sep == "percent", docs);
  CHECK((int64_t)docs.size() > o.val_docs,
        "%zu document(s) in %zu file(s): none left for training after --val-docs %lld", docs.size(),
        o.files.size(), (long long)o.val_docs);
  std::vector<uint32_t> val, train;
  for (size_t d = 0; d < docs.size(); d++)
    encode_document(e, docs[d], (int64_t)d < o.val_docs ? val : train);

  make_dirs(o.out);
  CHECK(!any_file_matches(o.out + "/" + o.name + "_*.bin"),
        "'%s' already holds %s_*.bin shards: remove them or choose another --out or --name",
        o.out.c_str(), o.name.c_str());
  int val_shards = write_shards(o.out, o.name, "val", val, o.shard_tokens, wide);
  int train_shards = write_shards(o.out, o.name, "train", train, o.shard_tokens, wide);
  write_tokenizer(o.out + "/tokenizer.bin", e.pieces, e.eot);
  write_file(o.out + "/vocab_size", std::to_string(e.pieces.size()) + "\n");
  std::printf(
      "tokenize: %zu documents from %zu file(s), tokenizer %s (%zu tokens, document token %d), "
      "%s shards\n",
      docs.size(), o.files.size(), e.kind.c_str(), e.pieces.size(), e.eot,
      wide ? "uint32" : "uint16");
  std::printf(
      "tokenize: train %zu tokens in %d shard(s), val %zu tokens (%lld documents) in %d shard(s) "
      "-> %s\n",
      train.size(), train_shards, val.size(), (long long)o.val_docs, val_shards, o.out.c_str());
  return 0;
}

int32_t read_int(const std::string& bytes, size_t k) {
  int32_t v;
  std::memcpy(&v, bytes.data() + 4 * k, 4);
  return v;
}

// Prints the text of a shard (v1 or v7) using tokenizer.bin's token bytes.
int decode_command(const Options& o) {
  if (o.tokenizer.empty() || o.files.size() != 1) usage();
  std::string tok = read_file(o.tokenizer), shard = read_file(o.files[0]);
  CHECK(tok.size() >= 1024 && read_int(tok, 0) == kTokenizerMagic &&
            read_int(tok, 1) == kTokenizerVersion,
        "'%s' is not a version 2 llm.c tokenizer file", o.tokenizer.c_str());
  std::vector<std::string> pieces;
  for (size_t at = 1024; (int)pieces.size() < read_int(tok, 2); at += 1 + (unsigned char)tok[at]) {
    CHECK(at < tok.size() && at + 1 + (unsigned char)tok[at] <= tok.size(), "'%s' is truncated",
          o.tokenizer.c_str());
    pieces.push_back(tok.substr(at + 1, (unsigned char)tok[at]));
  }
  CHECK(shard.size() >= 1024, "'%s' is shorter than a shard header", o.files[0].c_str());
  int32_t magic = read_int(shard, 0), version = read_int(shard, 1), ntok = read_int(shard, 2);
  size_t width = magic == 20240520 && version == 1 ? 2 : magic == 20240801 && version == 7 ? 4 : 0;
  CHECK(width && ntok >= 0 && shard.size() == 1024 + (size_t)ntok * width,
        "'%s': not an llm.c token shard (magic %d, version %d, %zu bytes for %d tokens)",
        o.files[0].c_str(), magic, version, shard.size(), ntok);
  std::string text;
  for (int32_t k = 0; k < ntok; k++) {
    uint32_t id = 0;
    std::memcpy(&id, shard.data() + 1024 + k * width, width);
    text += id < pieces.size() ? pieces[id] : "<" + std::to_string(id) + ">";
  }
  std::fwrite(text.data(), 1, text.size(), stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) usage();
  Options o = parse_options(argc, argv);
  std::string command = argv[1];
  if (command == "encode") return encode_command(o);
  if (command == "decode") return decode_command(o);
  usage();
}
