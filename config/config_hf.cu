// config/config_hf.cu - [init] from = "DIR" where DIR is a Hugging Face Llama directory: the
// [model] keys from DIR/config.json, each one given in the config checked against it.
//
// A key given in [model] must equal config.json's value (a mismatch names the key, both values
// and where each came from); a key not given is filled from config.json, as the llm.c reader
// fills the shape from its header (config/config_checks.cu). The pairs, with Hugging Face's
// LlamaConfig default where config.json may leave the key out:
//   hidden_size -> d_model            num_hidden_layers -> n_layer
//   num_attention_heads -> n_head     num_key_value_heads -> n_kv_head (default n_head)
//   intermediate_size -> d_ff         vocab_size -> vocab_size
//   rms_norm_eps -> norm_eps (1e-6)   rope_theta -> rope_theta (10000)
//   tie_word_embeddings -> tie_embeddings (false)
//   max_position_embeddings -> max_seq_len; seq_len must not exceed it and defaults to it
// and what our model cannot be is refused: model_type other than "llama", hidden_act other than
// "silu", attention_bias or mlp_bias true, head_dim other than hidden_size/num_attention_heads,
// and any non-null rope_scaling (Llama 3.1's long-context frequency rescaling is not built).
// [model] arch is filled as "llama" (arch = "gpt2" with a Hugging Face directory is a mismatch).
// The tensors themselves are checked when they are read (checkpoint/hf_llama.cu).
#include <sys/stat.h>

#include <cmath>

#include "config/config_schema.h"
#include "config/json.h"

namespace config_detail {

bool is_hf_directory(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

namespace {

struct HfKeys {
  Config& cfg;
  Origins& origins;
  Problems& problems;
  const JsonValue& json;
  std::string file;  // DIR/config.json, for messages
  bool agree = true;

  bool given(const std::string& id) const { return origins.count(id) > 0; }
  std::string origin() const { return "read from " + file; }
  void problem(const std::string& what) { problems.add(file + ": " + what), agree = false; }

  // The member `name` if present with kind `kind` (a wrong kind is a problem); else nullptr.
  const JsonValue* member(const char* name, JsonValue::Kind kind) {
    const JsonValue* v = json.find(name);
    if (!v || v->kind == JsonValue::Null) return nullptr;
    const bool number_ok = kind == JsonValue::Number && v->kind == JsonValue::Number;
    if (v->kind != kind && !number_ok) {
      JsonValue want;
      want.kind = kind;
      problem(strf("%s is %s (byte %zu), expected %s", name, v->kind_name(), v->offset,
                   want.kind_name()));
      return nullptr;
    }
    return v;
  }

  void mismatch(const char* id, const char* name, const std::string& ours,
                const std::string& theirs) {
    problems.add(mention(cfg, origins, id) + " disagrees with " + file + ": " + name + " = " +
                 theirs + " there (" + ours + " in the config)");
    agree = false;
  }

  // An integer key: fill or compare. required: a config.json without it is a problem.
  void int_key(const char* name, const char* id, int* field, bool required, int fallback) {
    const JsonValue* v = member(name, JsonValue::Number);
    if (v && (!v->is_integer || v->integer <= 0 || v->integer > INT32_MAX)) {
      problem(strf("%s must be a positive integer (byte %zu)", name, v->offset));
      return;
    }
    if (!v && required && !json.find(name)) problem(strf("has no %s", name));
    if (!v && required) return;
    const int theirs = v ? (int)v->integer : fallback;
    if (!given(id)) *field = theirs, origins[id] = origin();
    else if (*field != theirs) mismatch(id, name, strf("%d", *field), strf("%d", theirs));
  }

  void float_key(const char* name, const char* id, double* field, double fallback) {
    const JsonValue* v = member(name, JsonValue::Number);
    const double theirs = v ? v->number : fallback;
    if (!given(id)) *field = theirs, origins[id] = origin();
    else if (*field != theirs) mismatch(id, name, strf("%.9g", *field), strf("%.9g", theirs));
  }

  void bool_key(const char* name, const char* id, bool* field, bool fallback) {
    const JsonValue* v = member(name, JsonValue::Bool);
    const bool theirs = v ? v->boolean : fallback;
    if (!given(id)) *field = theirs, origins[id] = origin();
    else if (*field != theirs)
      mismatch(id, name, *field ? "true" : "false", theirs ? "true" : "false");
  }
};

// What our Llama cannot be: each a problem naming the key.
void refuse_unsupported(HfKeys& k) {
  const JsonValue* type = k.member("model_type", JsonValue::String);
  if (type && type->text != "llama")
    k.problem("model_type = \"" + type->text + "\": only \"llama\" (LlamaForCausalLM) is read");
  const JsonValue* act = k.member("hidden_act", JsonValue::String);
  if (act && act->text != "silu")
    k.problem("hidden_act = \"" + act->text + "\": the Llama MLP here is SwiGLU (\"silu\")");
  for (const char* bias : {"attention_bias", "mlp_bias"}) {
    const JsonValue* b = k.member(bias, JsonValue::Bool);
    if (b && b->boolean) k.problem(strf("%s = true: the Llama here has no biases", bias));
  }
  const JsonValue* scaling = k.json.find("rope_scaling");
  if (scaling && scaling->kind != JsonValue::Null)
    k.problem(strf("rope_scaling is set (byte %zu): rescaled rotary frequencies (Llama 3.1's "
                   "\"llama3\", \"linear\", \"dynamic\", ...) are not supported; only plain "
                   "RoPE with rope_theta", scaling->offset));
  const JsonValue* head_dim = k.member("head_dim", JsonValue::Number);
  const ModelConfig& m = k.cfg.model;
  if (head_dim && m.n_head > 0 && head_dim->number != (double)m.d_model / m.n_head)
    k.problem(strf("head_dim = %g, but hidden_size / num_attention_heads = %d / %d: only "
                   "head_dim = hidden_size / num_attention_heads is supported",
                   head_dim->number, m.d_model, m.n_head));
}

// seq_len (default: max_position_embeddings) and max_seq_len must fit the trained positions.
void position_keys(HfKeys& k) {
  const JsonValue* v = k.member("max_position_embeddings", JsonValue::Number);
  if (!v || !v->is_integer || v->integer <= 0 || v->integer > INT32_MAX) {
    if (!k.json.find("max_position_embeddings"))
      k.problem("has no max_position_embeddings");
    else if (v)
      k.problem(strf("max_position_embeddings must be a positive integer (byte %zu)", v->offset));
    return;
  }
  const int max_pos = (int)v->integer;
  ModelConfig& m = k.cfg.model;
  if (!k.given("model.seq_len")) m.seq_len = max_pos, k.origins["model.seq_len"] = k.origin();
  if (!k.given("model.max_seq_len"))  // kept, so that an export writes it back
    m.max_seq_len = max_pos, k.origins["model.max_seq_len"] = k.origin();
  for (const char* id : {"model.seq_len", "model.max_seq_len"}) {
    const int value = id[6] == 's' ? m.seq_len : m.max_seq_len;
    if (value > max_pos)
      k.problems.add(mention(k.cfg, k.origins, id) + " is longer than " + k.file +
                     strf(": max_position_embeddings = %d (the positions the model was trained "
                          "at)", max_pos)), k.agree = false;
  }
}

}  // namespace

void resolve_hf_model(Config& cfg, Origins& origins, Problems& problems) {
  const std::string dir = cfg.init.from;
  JsonValue json;
  const std::string file = dir + "/config.json";
  std::string err = json_parse_file(file, &json);
  if (!err.empty()) {
    problems.add(mention(cfg, origins, "init.from") + " is a directory, read as a Hugging Face "
                 "model: " + err);
    return;
  }
  if (json.kind != JsonValue::Object) {
    problems.add(file + ": expected a JSON object, found " + json.kind_name());
    return;
  }
  HfKeys k{cfg, origins, problems, json, file};
  ModelConfig& m = cfg.model;
  if (!k.given("model.arch")) m.arch = "llama", origins["model.arch"] = k.origin();
  else if (!m.is_llama()) k.mismatch("model.arch", "model_type", "\"" + m.arch + "\"", "llama");
  k.int_key("hidden_size", "model.d_model", &m.d_model, true, 0);
  k.int_key("num_hidden_layers", "model.n_layer", &m.n_layer, true, 0);
  k.int_key("num_attention_heads", "model.n_head", &m.n_head, true, 0);
  k.int_key("intermediate_size", "model.d_ff", &m.d_ff, true, 0);
  k.int_key("vocab_size", "model.vocab_size", &m.vocab_size, true, 0);
  const int n_head = m.n_head;  // num_key_value_heads defaults to the file's head count
  const JsonValue* nh = json.find("num_attention_heads");
  k.int_key("num_key_value_heads", "model.n_kv_head", &m.n_kv_head, false,
            nh && nh->is_integer ? (int)nh->integer : n_head);
  k.float_key("rms_norm_eps", "model.norm_eps", &m.norm_eps, 1e-6);
  k.float_key("rope_theta", "model.rope_theta", &m.rope_theta, 10000.0);
  k.bool_key("tie_word_embeddings", "model.tie_embeddings", &m.tie_embeddings, false);
  refuse_unsupported(k);
  position_keys(k);
}

}  // namespace config_detail
