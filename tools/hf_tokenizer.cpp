// tools/hf_tokenizer.cpp - reads a Hugging Face tokenizer.json into a byte-level BPE encoder.
//
// What is read:
//   model            {"type": "BPE", "vocab": {string: id}, "merges": ["a b", ...] or
//                    [["a", "b"], ...], "ignore_merges": bool}; vocabulary strings spell bytes
//                    through GPT-2's byte-to-unicode table (undone here).
//   added_tokens     [{"id", "content", "special"}]: special tokens (<|begin_of_text|>, ...). Their
//                    ids may also be in the vocabulary (GPT-2's <|endoftext|>) or only here
//                    (Llama-3's 128000..128255). Their text inside a document is encoded as
//                    ordinary text, never as the special token (a document cannot forge one).
//   pre_tokenizer    ByteLevel with use_regex (GPT-2's pattern), or a Sequence of a Split
//                    (behavior Isolated, not inverted) by GPT-2's or Llama-3's pattern and a
//                    ByteLevel without regex. Any other pattern is refused, quoting it.
// The ids of the vocabulary and the added tokens must be 0..N-1, each once. The post-processor
// (which adds <|begin_of_text|> per sequence) and the decoder are not used: the tool writes the
// document token itself, before each document, as llm.c's Llama-3 data has it.
#include "tools/hf_tokenizer.h"

#include <climits>

#include "kernels/common.h"
#include "config/json.h"

namespace {

struct Source {
  const std::string& name;
};

const JsonValue& member(const JsonValue& v, const char* key, JsonValue::Kind kind,
                        const char* where, const Source& src) {
  const JsonValue* m = v.find(key);
  CHECK(m && m->kind == kind, "'%s': %s has no \"%s\" of the expected type", src.name.c_str(),
        where, key);
  return *m;
}

// True when `key` is absent, null, false or "" in v.
bool unset(const JsonValue& v, const char* key) {
  const JsonValue* m = v.find(key);
  return !m || m->kind == JsonValue::Null || (m->kind == JsonValue::Bool && !m->boolean) ||
         (m->kind == JsonValue::String && m->text.empty());
}

std::string type_of(const JsonValue& v) {
  const JsonValue* t = v.find("type");
  return t && t->kind == JsonValue::String ? t->text : "?";
}

void check_byte_level(const JsonValue& b, bool with_regex, const Source& src) {
  CHECK(unset(b, "add_prefix_space"),
        "'%s': pre_tokenizer ByteLevel with add_prefix_space is not supported", src.name.c_str());
  const JsonValue* r = b.find("use_regex");
  bool regex = !r || r->kind == JsonValue::Null || (r->kind == JsonValue::Bool && r->boolean);  // default true
  CHECK(regex == with_regex, "'%s': pre_tokenizer ByteLevel with use_regex = %s is not supported "
        "here", src.name.c_str(), regex ? "true" : "false");
}

SplitPattern split_pattern(const JsonValue& split, const Source& src) {
  const JsonValue* p = split.find("pattern");
  const JsonValue* regex = p ? p->find("Regex") : nullptr;
  CHECK(regex && regex->kind == JsonValue::String,
        "'%s': the Split pre-tokenizer has no {\"Regex\": ...} pattern", src.name.c_str());
  const JsonValue* behavior = split.find("behavior");
  CHECK(behavior && behavior->text == "Isolated" && unset(split, "invert"),
        "'%s': only a Split with behavior \"Isolated\", not inverted, is supported",
        src.name.c_str());
  if (regex->text == kGpt2Pattern) return SplitPattern::Gpt2;
  if (regex->text == kLlama3Pattern) return SplitPattern::Llama3;
  FATAL("'%s': the pre-tokenizer's split pattern %s is not supported: only GPT-2's and "
        "Llama-3's byte-level BPE patterns are implemented", src.name.c_str(), regex->text.c_str());
}

SplitPattern read_pre_tokenizer(const JsonValue& root, const Source& src) {
  const JsonValue* pre = root.find("pre_tokenizer");
  CHECK(pre && pre->kind == JsonValue::Object, "'%s': no pre_tokenizer", src.name.c_str());
  std::string type = type_of(*pre);
  if (type == "ByteLevel") {
    check_byte_level(*pre, true, src);
    return SplitPattern::Gpt2;
  }
  CHECK(type == "Sequence", "'%s': pre_tokenizer type \"%s\" is not supported (ByteLevel, or a "
        "Sequence of Split and ByteLevel)", src.name.c_str(), type.c_str());
  const JsonValue& seq = member(*pre, "pretokenizers", JsonValue::Array, "pre_tokenizer", src);
  CHECK(seq.items.size() == 2 && type_of(seq.items[0]) == "Split" &&
            type_of(seq.items[1]) == "ByteLevel",
        "'%s': the pre_tokenizer Sequence must be [Split, ByteLevel]", src.name.c_str());
  check_byte_level(seq.items[1], false, src);
  return split_pattern(seq.items[0], src);
}

void check_model(const JsonValue& model, const Source& src) {
  const char* n = src.name.c_str();
  CHECK(type_of(model) == "BPE", "'%s': model type \"%s\" is not supported (byte-level BPE only)",
        n, type_of(model).c_str());
  for (const char* key : {"dropout", "byte_fallback", "continuing_subword_prefix",
                          "end_of_word_suffix"})
    CHECK(unset(model, key), "'%s': model.%s is set: not supported by this byte-level BPE", n, key);
}

// Places token `id` with the given bytes; ids must be unique.
void place(ByteLevelBpe& v, long long id, const std::string& piece, bool special,
           const Source& src) {
  CHECK(id >= 0, "'%s': token '%s' has no valid id", src.name.c_str(), piece.c_str());
  if ((size_t)id >= v.pieces.size()) v.pieces.resize(id + 1), v.special.resize(id + 1, false);
  CHECK(v.pieces[id].empty() || (special && v.pieces[id] == piece && !v.special[id]),
        "'%s': token id %lld is given twice", src.name.c_str(), id);
  v.pieces[id] = piece;
  v.special[id] = special;
}

void read_vocab(ByteLevelBpe& v, const JsonValue& vocab, const Source& src) {
  std::vector<int> table = unicode_to_byte_table();
  for (const auto& [key, value] : vocab.members) {
    std::string bytes = unicode_to_bytes(key, table, src.name.c_str());
    long long id = json_id(value, INT_MAX - 1);
    place(v, id, bytes, false, src);
    CHECK(!bytes.empty(), "'%s': empty vocabulary entry", src.name.c_str());
    v.ids[bytes] = (int)id;
  }
}

void read_added_tokens(ByteLevelBpe& v, const JsonValue& root, const Source& src) {
  const JsonValue* added = root.find("added_tokens");
  if (!added || added->kind == JsonValue::Null) return;
  CHECK(added->kind == JsonValue::Array, "'%s': added_tokens is not a list", src.name.c_str());
  for (const JsonValue& t : added->items) {
    const JsonValue& content = member(t, "content", JsonValue::String, "an added token", src);
    const JsonValue* special = t.find("special");
    CHECK(special && special->kind == JsonValue::Bool && special->boolean,
          "'%s': added token '%s' is not special: Hugging Face matches such tokens inside the "
          "text, which this tool does not", src.name.c_str(), content.text.c_str());
    CHECK(!content.text.empty(), "'%s': an added token is empty", src.name.c_str());
    place(v, json_id(member(t, "id", JsonValue::Number, "an added token", src), INT_MAX - 1),
          content.text, true, src);
    auto in_vocab = v.ids.find(content.text);
    if (in_vocab != v.ids.end() && v.special[in_vocab->second]) v.ids.erase(in_vocab);
  }
}

void read_merges(ByteLevelBpe& v, const JsonValue& merges, const Source& src) {
  std::vector<int> table = unicode_to_byte_table();
  const char* n = src.name.c_str();
  for (size_t rank = 0; rank < merges.items.size(); rank++) {
    const JsonValue& m = merges.items[rank];
    std::string left, right;
    if (m.kind == JsonValue::String) {
      size_t space = m.text.find(' ');
      CHECK(space != std::string::npos && m.text.find(' ', space + 1) == std::string::npos,
            "'%s': merge %zu '%s' is not \"left right\"", n, rank, m.text.c_str());
      left = m.text.substr(0, space), right = m.text.substr(space + 1);
    } else {
      CHECK(m.kind == JsonValue::Array && m.items.size() == 2 &&
                m.items[0].kind == JsonValue::String && m.items[1].kind == JsonValue::String,
            "'%s': merge %zu is neither \"left right\" nor [left, right]", n, rank);
      left = m.items[0].text, right = m.items[1].text;
    }
    left = unicode_to_bytes(left, table, n), right = unicode_to_bytes(right, table, n);
    auto l = v.ids.find(left), r = v.ids.find(right), lr = v.ids.find(left + right);
    CHECK(l != v.ids.end() && r != v.ids.end() && lr != v.ids.end(),
          "'%s': merge %zu: '%s', '%s' or their concatenation is not in the vocabulary", n, rank,
          left.c_str(), right.c_str());
    v.merges.emplace(bpe_pair_key(l->second, r->second), BpeMerge{(int)rank, lr->second});
  }
}

int find_doc_token(const ByteLevelBpe& v, const std::string& wanted, const Source& src) {
  const char* defaults[] = {"<|begin_of_text|>", "<|endoftext|>", "<|end_of_text|>"};
  std::vector<std::string> names = wanted.empty() ? std::vector<std::string>(defaults, defaults + 3)
                                                  : std::vector<std::string>{wanted};
  for (const std::string& name : names)
    for (size_t id = 0; id < v.pieces.size(); id++)
      if (v.special[id] && v.pieces[id] == name) return (int)id;
  if (!wanted.empty())
    FATAL("'%s': --doc-token '%s' is not a special token of this tokenizer", src.name.c_str(),
          wanted.c_str());
  FATAL("'%s': none of <|begin_of_text|>, <|endoftext|>, <|end_of_text|> is a special token: "
        "name the document separator with --doc-token", src.name.c_str());
}

}  // namespace

ByteLevelBpe hf_tokenizer_load(const std::string& text, const std::string& name,
                               const std::string& doc_token) {
  Source src{name};
  JsonValue root = json_parse_or_die(text, name);
  CHECK(root.kind == JsonValue::Object, "'%s': not a tokenizer.json object", name.c_str());
  const JsonValue* normalizer = root.find("normalizer");
  CHECK(!normalizer || normalizer->kind == JsonValue::Null,
        "'%s': a normalizer (%s) is not supported", name.c_str(), type_of(*normalizer).c_str());
  const JsonValue& model = member(root, "model", JsonValue::Object, "the file", src);
  check_model(model, src);
  ByteLevelBpe v;
  v.pattern = read_pre_tokenizer(root, src);
  v.ignore_merges = !unset(model, "ignore_merges");
  read_vocab(v, member(model, "vocab", JsonValue::Object, "model", src), src);
  read_added_tokens(v, root, src);
  for (size_t id = 0; id < v.pieces.size(); id++)
    CHECK(!v.pieces[id].empty(), "'%s': no token has id %zu (ids must be 0..%zu, each once)",
          name.c_str(), id, v.pieces.size() - 1);
  bpe_set_byte_tokens(v, name.c_str());
  read_merges(v, member(model, "merges", JsonValue::Array, "model", src), src);
  v.doc_token = find_doc_token(v, doc_token, src);
  return v;
}
