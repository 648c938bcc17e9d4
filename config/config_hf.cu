// config/config_hf.cu - [init] from = "DIR" where DIR is a Hugging Face Llama or Mixtral
// directory: the [model] keys from DIR/config.json, each one given in the config checked against
// it.
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
// and what our model cannot be is refused: model_type other than "llama" or "mixtral", hidden_act
// other than "silu", attention_bias or mlp_bias true, head_dim other than
// hidden_size/num_attention_heads, and any non-null rope_scaling (Llama 3.1's long-context
// frequency rescaling is not built). A "llama" directory is dense: [model] n_experts > 0 is a
// mismatch. [model] arch is filled as "llama" (arch = "gpt2" with a Hugging Face directory is a
// mismatch).
//
// Mixtral (model_type "mixtral", MixtralForCausalLM) is a Llama whose every MLP is a sparse MoE
// block: a router block_sparse_moe.gate (E, d_model) and E SwiGLU experts w1 (gate), w3 (up),
// w2 (down) of hidden size intermediate_size. Its keys, with MixtralConfig's defaults:
//   num_local_experts -> n_experts (8)     num_experts_per_tok -> top_k (2)
//   intermediate_size -> d_expert (not d_ff: a Mixtral has no dense MLP)
//   num_key_value_heads (8), rms_norm_eps (1e-5), rope_theta (1e6)
// and [model] moe_every = 1, n_shared_experts = 0, router_score = "softmax" (filled, or checked
// when given). Mixtral's router, p = softmax(gate(x)) over all E experts, the top k of p, their
// weights renormalised over the chosen k (routing_weights /= sum), is model/moe.cu's softmax
// router exactly for top_k >= 2 (a tie between two p inside the top k is decided by index here,
// by torch.topk there: measure zero with real weights). It cannot be expressed for: top_k = 1
// (Mixtral renormalises the one gate to 1, ours keeps the raw p_e), router_jitter_noise other
// than 0 (multiplicative noise on the router's input in training) and a sliding_window shorter
// than max_position_embeddings (attention here sees every earlier position): each refused.
// router_aux_loss_coef and output_router_logits are Hugging Face's training options and are not
// read; [train] moe_aux_loss and moe_z_loss set ours.
// The tensors themselves are checked when they are read (checkpoint/hf_llama.cu).
#include <sys/stat.h>

#include <cmath>
#include <functional>

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
  if (type && type->text != "llama" && type->text != "mixtral")
    k.problem("model_type = \"" + type->text + "\": only \"llama\" (LlamaForCausalLM) and "
              "\"mixtral\" (MixtralForCausalLM) are read");
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

// A [model] key that a Mixtral fixes (moe_every 1, n_shared_experts 0, router_score "softmax"):
// filled, or a mismatch when given otherwise.
void fixed_key(HfKeys& k, const char* id, bool given_agrees, const char* theirs,
               const std::string& ours, const std::function<void()>& fill) {
  if (!k.given(id)) fill(), k.origins[id] = k.origin();
  else if (!given_agrees) k.mismatch(id, "model_type", ours, theirs);
}

// Mixtral's experts and router (the comment at the top says how its router maps onto ours).
void mixtral_keys(HfKeys& k) {
  ModelConfig& m = k.cfg.model;
  k.int_key("num_local_experts", "model.n_experts", &m.n_experts, false, 8);
  k.int_key("num_experts_per_tok", "model.top_k", &m.top_k, false, 2);
  k.int_key("intermediate_size", "model.d_expert", &m.d_expert, true, 0);
  fixed_key(k, "model.moe_every", m.moe_every == 1,
            "\"mixtral\" (every layer an MoE layer: moe_every = 1)",
            std::to_string(m.moe_every), [&] { m.moe_every = 1; });
  fixed_key(k, "model.n_shared_experts", m.n_shared_experts == 0,
            "\"mixtral\" (no shared experts: n_shared_experts = 0)",
            std::to_string(m.n_shared_experts), [&] { m.n_shared_experts = 0; });
  fixed_key(k, "model.router_score", m.router_score == "softmax",
            "\"mixtral\" (a softmax router: router_score = \"softmax\")",
            "\"" + m.router_score + "\"", [&] { m.router_score = "softmax"; });
  const JsonValue* top_k = k.member("num_experts_per_tok", JsonValue::Number);
  if (top_k && top_k->is_integer && top_k->integer == 1)
    k.problem("num_experts_per_tok = 1: Mixtral renormalises the one chosen gate to 1, while "
              "the router here (model/moe.cu) keeps the raw softmax probability at top_k = 1; "
              "only num_experts_per_tok >= 2 is read");
  const JsonValue* jitter = k.member("router_jitter_noise", JsonValue::Number);
  if (jitter && jitter->number != 0)
    k.problem(strf("router_jitter_noise = %g: the router here has no input noise; only 0 is "
                   "read", jitter->number));
  const JsonValue* window = k.member("sliding_window", JsonValue::Number);
  const JsonValue* max_pos = k.member("max_position_embeddings", JsonValue::Number);
  if (window && max_pos && window->number < max_pos->number)
    k.problem(strf("sliding_window = %g is shorter than max_position_embeddings = %g: "
                   "attention here sees every earlier position; only a null or no shorter "
                   "window is read", window->number, max_pos->number));
}

// A "llama" directory is dense: experts given in [model] disagree with it.
void llama_has_no_experts(HfKeys& k) {
  const ModelConfig& m = k.cfg.model;
  if (k.given("model.n_experts") && m.n_experts > 0)
    k.mismatch("model.n_experts", "model_type", std::to_string(m.n_experts),
               "\"llama\" (a dense LlamaForCausalLM: no experts; a Mixtral has model_type "
               "\"mixtral\")");
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
  const JsonValue* type = json.find("model_type");
  const bool mixtral = type && type->kind == JsonValue::String && type->text == "mixtral";
  if (mixtral) mixtral_keys(k);
  else k.int_key("intermediate_size", "model.d_ff", &m.d_ff, true, 0), llama_has_no_experts(k);
  k.int_key("vocab_size", "model.vocab_size", &m.vocab_size, true, 0);
  const int n_head = m.n_head;  // Llama's num_key_value_heads defaults to the file's head count
  const JsonValue* nh = json.find("num_attention_heads");
  k.int_key("num_key_value_heads", "model.n_kv_head", &m.n_kv_head, false,
            mixtral ? 8 : nh && nh->is_integer ? (int)nh->integer : n_head);
  k.float_key("rms_norm_eps", "model.norm_eps", &m.norm_eps, mixtral ? 1e-5 : 1e-6);
  k.float_key("rope_theta", "model.rope_theta", &m.rope_theta, mixtral ? 1e6 : 10000.0);
  k.bool_key("tie_word_embeddings", "model.tie_embeddings", &m.tie_embeddings, false);
  refuse_unsupported(k);
  position_keys(k);
}

}  // namespace config_detail
