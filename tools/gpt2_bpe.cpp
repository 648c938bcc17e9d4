// tools/gpt2_bpe.cpp - GPT-2's tokenizer from OpenAI's files: encoder.json (a flat JSON object,
// token string -> id) and vocab.bpe (a "#version" line, then one merge "left right" per line,
// rank = order). Both spell bytes through GPT-2's byte-to-unicode table, undone at load time, so
// the encoder works on raw bytes and any input (even invalid UTF-8) encodes and decodes back
// exactly. <|endoftext|> is kept out of the byte-string lookup, so that the text "<|endoftext|>"
// is encoded like any other.
#include "tools/gpt2_bpe.h"

#include "kernels/common.h"
#include "config/json.h"

namespace {

constexpr const char* kEotText = "<|endoftext|>";

int lookup(const std::unordered_map<std::string, int>& ids, const std::string& bytes,
           const char* name, size_t line) {
  auto it = ids.find(bytes);
  CHECK(it != ids.end(), "'%s' line %zu: a token of this merge is not in encoder.json", name, line);
  return it->second;
}

// Fills pieces, special, doc_token, ids and byte_token from encoder.json.
void load_encoder(ByteLevelBpe& v, const std::string& text, const char* name,
                  const std::vector<int>& table) {
  JsonValue root = json_parse_or_die(text, name);
  CHECK(root.kind == JsonValue::Object, "'%s': expected an object of token strings to ids", name);
  size_t n = root.members.size();
  v.pieces.resize(n);
  v.special.assign(n, false);
  std::vector<bool> seen(n, false);
  for (size_t i = 0; i < n; i++) {
    const std::string& key = root.members[i].first;
    int id = (int)json_id(root.members[i].second, (long long)n - 1);
    CHECK(id >= 0 && !seen[id],
          "'%s': token ids must be 0..%zu, each once (token '%s')", name, n - 1, key.c_str());
    seen[id] = true;
    bool eot = key == kEotText;
    v.pieces[id] = eot ? key : unicode_to_bytes(key, table, name);
    v.special[id] = eot;
    if (eot)
      v.doc_token = id;
    else
      v.ids[v.pieces[id]] = id;
  }
  CHECK(v.doc_token >= 0, "'%s': no %s entry", name, kEotText);
  bpe_set_byte_tokens(v, name);
}

void load_merges(ByteLevelBpe& v, const std::string& text, const char* name,
                 const std::vector<int>& table) {
  size_t line = 0, rank = 0;
  for (size_t at = 0; at < text.size();) {
    size_t nl = text.find('\n', at);
    if (nl == std::string::npos) nl = text.size();
    std::string merge = text.substr(at, nl - at);
    at = nl + 1, line++;
    if ((line == 1 && merge.rfind("#version", 0) == 0) || merge.empty()) continue;
    size_t space = merge.find(' ');
    CHECK(space != std::string::npos, "'%s' line %zu: expected 'left right'", name, line);
    std::string left = unicode_to_bytes(merge.substr(0, space), table, name);
    std::string right = unicode_to_bytes(merge.substr(space + 1), table, name);
    int l = lookup(v.ids, left, name, line), r = lookup(v.ids, right, name, line);
    v.merges[bpe_pair_key(l, r)] = {(int)rank++, lookup(v.ids, left + right, name, line)};
  }
}

}  // namespace

ByteLevelBpe gpt2_bpe_load(const std::string& encoder_json, const char* encoder_name,
                           const std::string& vocab_bpe, const char* bpe_name) {
  ByteLevelBpe v;
  std::vector<int> table = unicode_to_byte_table();
  load_encoder(v, encoder_json, encoder_name, table);
  load_merges(v, vocab_bpe, bpe_name, table);
  return v;
}
