// config/config_schema.cu - the config's schema and values (config/config_schema.h): one line per
// key (section, key, the Config field, whose C++ type is the key's TOML type), TOML nodes into
// fields with the type and range checks of each kind, fields back into TOML text, and the
// messages that name a value and where it came from.
#include "config/config_schema.h"

#include <algorithm>
#include <cfloat>
#include <climits>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <sstream>

#include "kernels/common.h"

namespace config_detail {

// ---------------------------------------------------------------------------------------------
// Messages

std::string strf(const char* fmt, ...) {
  va_list args, again;
  va_start(args, fmt);
  va_copy(again, args);
  std::string out(std::vsnprintf(nullptr, 0, fmt, args), '\0');
  std::vsnprintf(&out[0], out.size() + 1, fmt, again);
  va_end(again);
  va_end(args);
  return out;
}

void Problems::stop_if_any() const {
  if (list.empty()) return;
  if (list.size() == 1) FATAL_ALL("%s", list[0].c_str());
  std::string all = strf("invalid configuration, %zu problems:", list.size());
  for (const std::string& msg : list) all += "\n  - " + msg;
  FATAL_ALL("%s", all.c_str());
}

static std::string origin_of(const Origins& origins, const std::string& id) {
  auto it = origins.find(id);
  return it == origins.end() ? "default" : it->second;
}

// TOML++'s description of a syntax error, worded so that a message holds one spelling of
// "error": "Error while parsing value: ..." -> "TOML parse error while parsing value: ...".
std::string parse_problem(const toml::parse_error& e) {
  std::string d(e.description());
  if (d.compare(0, 6, "Error ") == 0) return "TOML parse error " + d.substr(6);
  return "TOML parse error: " + d;
}

std::string location(const std::string& source, const toml::source_region& region) {
  return strf("%s:%u:%u", source.c_str(), (unsigned)region.begin.line,
              (unsigned)region.begin.column);
}

// ---------------------------------------------------------------------------------------------
// The schema: one line per key. The field's C++ type is the key's TOML type.

#define KEY(sec, key, ...) Key{#sec, #key, [](Config& c) -> FieldRef { return &c.sec.key; }, \
                                {__VA_ARGS__}}

const std::vector<Key>& schema() {  // function-local static: built once, read-only
  static const std::vector<Key> keys = {
      KEY(model, n_layer), KEY(model, n_head), KEY(model, d_model), KEY(model, seq_len),
      KEY(model, max_seq_len), KEY(model, vocab_size), KEY(model, n_experts),
      KEY(model, top_k), KEY(model, moe_every), KEY(model, d_expert),
      KEY(model, n_shared_experts), KEY(model, router_score, "softmax", "sigmoid"),
      KEY(model, arch, "gpt2", "llama"), KEY(model, n_kv_head), KEY(model, d_ff),
      KEY(model, rope_theta), KEY(model, norm_eps), KEY(model, tie_embeddings),
      KEY(init, from),
      KEY(data, train), KEY(data, weights), KEY(data, val), KEY(data, shuffle), KEY(data, tokenizer),
      KEY(data, allow_changed), KEY(data, document_mask), KEY(data, eot_token),
      KEY(data, document_positions),
      KEY(train, micro_batch), KEY(train, grad_accum), KEY(train, steps), KEY(train, lr),
      KEY(train, warmup_steps), KEY(train, lr_schedule, "cosine", "constant"),
      KEY(train, min_lr), KEY(train, weight_decay), KEY(train, grad_clip), KEY(train, beta1),
      KEY(train, beta2), KEY(train, eps), KEY(train, seed),
      KEY(train, recompute, "none", "gelu", "block"), KEY(train, moe_aux_loss),
      KEY(train, moe_z_loss), KEY(train, moe_balance, "aux_loss", "bias"),
      KEY(train, moe_bias_rate), KEY(train, moe_capacity_factor), KEY(train, skip_spikes), KEY(train, max_skips),
      KEY(train, optimizer_offload, "none", "cpu", "nvme"), KEY(train, offload_dir),
      KEY(parallel, dp), KEY(parallel, tp), KEY(parallel, pp), KEY(parallel, cp),
      KEY(parallel, cp_comm, "ring", "all-to-all", "hybrid"), KEY(parallel, cp_a2a),
      KEY(parallel, ep), KEY(parallel, sp), KEY(parallel, tp_overlap), KEY(parallel, zero), KEY(parallel, fsdp),
      KEY(parallel, grad_compression, "none", "int8", "topk"), KEY(parallel, topk_ratio),
      KEY(parallel, dp_replicate), KEY(parallel, reduce_dtype, "fp32", "bf16"),
      KEY(parallel, bucket_mb), KEY(parallel, fsdp_prefetch),
      KEY(parallel, diloco_islands), KEY(parallel, diloco_every), KEY(parallel, diloco_outer_lr),
      KEY(parallel, diloco_outer_momentum), KEY(parallel, diloco_compression, "none", "int8"),
      KEY(parallel, pp_schedule, "1f1b", "gpipe", "interleaved", "zb-h1", "zb-v", "file:"),
      KEY(parallel, pp_virtual), KEY(parallel, pp_layers),
      KEY(parallel, pp_balance, "equal", "auto"), KEY(parallel, backend, "nccl", "mpi", ""),
      KEY(parallel, timeout_s),
      KEY(precision, compute, "fp32", "bf16", "fp8"),
      KEY(precision, fp8_recipe, "tensorwise", "delayed", "rowwise", "blockwise", "mxfp8"),
      KEY(precision, fp8_amax_history), KEY(precision, fp8_margin),
      KEY(kernels, attention, "auto", "flash", "cudnn"), KEY(kernels, cuda_graph, "off", "step"),
      KEY(checkpoint, dir), KEY(checkpoint, every), KEY(checkpoint, keep),
      KEY(checkpoint, resume), KEY(checkpoint, overwrite), KEY(checkpoint, async),
      KEY(checkpoint, lock_wait_s),
      KEY(log, every), KEY(log, metrics), KEY(log, val_every), KEY(log, val_batches),
      KEY(log, sample_every), KEY(log, sample_tokens),
      KEY(log, sample_temperature), KEY(log, sample_top_k), KEY(log, sample_kv_cache),
      KEY(log, peak_tflops),
      KEY(log, pipeline_timeline), KEY(log, check_tied), KEY(log, check_replicas),
      KEY(log, straggler_every),
      KEY(log, straggler_factor), KEY(log, grad_noise_scale), KEY(log, trace),
      KEY(log, trace_steps),
      KEY(eval, file), KEY(eval, every), KEY(eval, examples),
      KEY(plan, device), KEY(plan, peak_tflops), KEY(plan, matmul_efficiency), KEY(plan, hbm_gbs),
      KEY(plan, intra_node_gbs), KEY(plan, inter_node_gbs), KEY(plan, gpus_per_node),
      KEY(plan, memory_gib), KEY(plan, pcie_gbs), KEY(plan, nvme_gbs),
  };
  return keys;
}
#undef KEY

const std::vector<const char*>& sections() {
  static const std::vector<const char*> names = {"model", "init", "data", "train", "parallel",
                                                 "precision", "kernels", "checkpoint", "log",
                                                 "eval", "plan"};
  return names;
}

bool is_section(const std::string& name) {
  for (const char* s : sections())
    if (name == s) return true;
  return false;
}

const Key* find_key(const std::string& section, const std::string& name) {
  for (const Key& k : schema())
    if (section == k.section && name == k.name) return &k;
  return nullptr;
}

const Key& key_by_id(const std::string& id) {
  for (const Key& k : schema())
    if (id == k.id()) return k;
  BUG("no key '%s' in the config schema", id.c_str());
}

// The keys of `section`, or with "" the sections, as a list for messages.
std::string known_names(const std::string& section) {
  std::string names;
  for (const Key& k : schema())
    if (section == k.section) names += std::string(names.empty() ? "" : ", ") + k.name;
  for (const char* s : sections())
    if (section.empty()) names += std::string(names.empty() ? "" : ", ") + s;
  return names;
}

// The message for an unknown section (name == "") or an unknown key of a known section.
std::string unknown(const std::string& where, const std::string& section, const std::string& name) {
  if (name.empty())
    return strf("%s: unknown section [%s] (known sections: %s)", where.c_str(), section.c_str(),
                known_names("").c_str());
  return strf("%s: unknown key '%s' in [%s] (known keys: %s)", where.c_str(), name.c_str(),
              section.c_str(), known_names(section).c_str());
}

static std::string list_choices(const Key& key) {  // "\"cosine\", \"constant\""
  std::string out;
  for (const std::string& c : key.choices)
    out += (out.empty() ? "\"" : ", \"") + c + (c.back() == ':' ? "PATH" : "") + "\"";
  return out;
}

// A choice ending in ':' is a prefix ("file:" takes "file:my.csv").
static bool is_choice(const Key& key, const std::string& v) {
  for (const std::string& c : key.choices)
    if (v == c || (c.back() == ':' && v.size() > c.size() && v.compare(0, c.size(), c) == 0))
      return true;
  return false;
}

// The accessors take a Config& to hand out writable fields; code that only reads goes through
// this one const_cast.
FieldRef field_of(const Config& cfg, const Key& key) {
  return key.field(const_cast<Config&>(cfg));
}

// ---------------------------------------------------------------------------------------------
// Values: TOML node -> field, and field -> TOML text.

const char* node_kind(const toml::node& n) {
  const char* kinds[] = {"nothing", "a table", "an array",  "a string", "an integer",
                         "a float", "a boolean", "a date", "a time", "a date-time"};
  return kinds[(int)n.type()];  // in the order of toml::node_type
}

static std::string node_text(const toml::node& n) {
  if (!n.is_value()) return node_kind(n);
  std::ostringstream os;
  os << toml::node_view<const toml::node>(&n);
  return std::string(node_kind(n)) + " (" + os.str() + ")";
}

std::string expected_kind(FieldRef field) {
  const char* kinds[] = {"an integer", "an integer >= 0", "a number", "a number", "true or false",
                         "a string", "an array of integers",
                         "a string or an array of strings", "an array of numbers"};  // FieldRef's
                                                                                     // order
  return kinds[field.index()];
}

// Reads a number for a float key: an integer literal is fine too.
static std::string read_number(const toml::node& n, double* out) {
  if (n.is_integer()) *out = (double)n.as_integer()->get();
  else if (n.is_floating_point()) *out = n.as_floating_point()->get();
  else return "expects a number, got " + node_text(n);
  if (!std::isfinite(*out)) return "must be a finite number, got " + node_text(n);
  return "";
}

// Stores `n` into the key's field; returns "" or what is wrong (without the location).
std::string set_field(Config& cfg, const Key& key, const toml::node& n) {
  struct Setter {
    const Key& key;
    const toml::node& n;
    std::string integer(int64_t lo, int64_t hi, int64_t* v) const {
      if (!n.is_integer()) return "expects an integer, got " + node_text(n);
      *v = n.as_integer()->get();
      if (*v < lo || *v > hi) return strf("%lld is out of range [%lld, %lld]", (long long)*v,
                                          (long long)lo, (long long)hi);
      return "";
    }
    std::string operator()(int* f) const {
      int64_t v = 0;
      std::string err = integer(INT_MIN, INT_MAX, &v);
      return err.empty() ? (*f = (int)v, err) : err;
    }
    std::string operator()(uint64_t* f) const {
      int64_t v = 0;
      std::string err = integer(0, INT64_MAX, &v);
      return err.empty() ? (*f = (uint64_t)v, err) : err;
    }
    std::string operator()(float* f) const {
      double v = 0;
      std::string err = read_number(n, &v);
      if (!err.empty()) return err;
      if (std::fabs(v) > FLT_MAX) return strf("%g is out of range for a 32-bit float", v);
      if (v != 0 && (float)v == 0) return strf("%g underflows to 0 as a 32-bit float", v);
      *f = (float)v;
      return "";
    }
    std::string operator()(double* f) const { return read_number(n, f); }
    std::string operator()(bool* f) const {
      if (!n.is_boolean()) return "expects true or false, got " + node_text(n);
      *f = n.as_boolean()->get();
      return "";
    }
    std::string operator()(std::string* f) const {
      if (!n.is_string()) return "expects a string, got " + node_text(n);
      const std::string& v = n.as_string()->get();
      if (!key.choices.empty() && !is_choice(key, v))
        return "\"" + v + "\" is not one of " + list_choices(key);
      *f = v;
      return "";
    }
    std::string operator()(std::vector<int>* f) const {
      if (!n.is_array()) return "expects an array of integers, got " + node_text(n);
      std::vector<int> out;
      for (const toml::node& e : *n.as_array()) {
        if (!e.is_integer()) return "expects an array of integers, one element is " + node_text(e);
        const int64_t v = e.as_integer()->get();
        if (v < INT_MIN || v > INT_MAX) return strf("%lld is out of range", (long long)v);
        out.push_back((int)v);
      }
      *f = out;
      return "";
    }
    std::string operator()(std::vector<std::string>* f) const {  // a string is one element
      if (n.is_string()) {
        *f = {n.as_string()->get()};
        return "";
      }
      if (!n.is_array() || n.as_array()->empty())
        return "expects a string or a non-empty array of strings, got " + node_text(n);
      std::vector<std::string> out;
      for (const toml::node& e : *n.as_array()) {
        if (!e.is_string()) return "expects an array of strings, one element is " + node_text(e);
        out.push_back(e.as_string()->get());
      }
      *f = out;
      return "";
    }
    std::string operator()(std::vector<double>* f) const {
      if (!n.is_array()) return "expects an array of numbers, got " + node_text(n);
      std::vector<double> out;
      for (const toml::node& e : *n.as_array()) {
        double v = 0;
        const std::string err = read_number(e, &v);
        if (!err.empty()) return "an element " + err;
        out.push_back(v);
      }
      *f = out;
      return "";
    }
  };
  return std::visit(Setter{key, n}, key.field(cfg));
}

// A TOML basic string: quoted, with \, " and control characters escaped.
static std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') out += '\\', out += (char)c;
    else if (c < 0x20 || c == 0x7f) out += strf("\\u%04x", c);
    else out += (char)c;
  }
  return out + "\"";
}

// The shortest decimal that reads back to exactly `v`, always with a '.' or an exponent so
// that TOML reads it as a float.
template <typename T>
static std::string shortest_float(T v, int max_digits) {
  std::string s;
  for (int digits = 1; digits <= max_digits; digits++) {
    s = strf("%.*g", digits, (double)v);
    if ((T)std::strtod(s.c_str(), nullptr) == v) break;
  }
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

std::string field_text(const Config& cfg, const Key& key) {
  struct Printer {
    std::string operator()(int* f) const { return strf("%d", *f); }
    std::string operator()(uint64_t* f) const { return strf("%llu", (unsigned long long)*f); }
    std::string operator()(float* f) const { return shortest_float(*f, 9); }
    std::string operator()(double* f) const { return shortest_float(*f, 17); }
    std::string operator()(bool* f) const { return *f ? "true" : "false"; }
    std::string operator()(std::string* f) const { return quoted(*f); }
    std::string operator()(std::vector<int>* f) const {
      std::string out = "[";
      for (size_t i = 0; i < f->size(); i++) out += strf("%s%d", i ? ", " : "", (*f)[i]);
      return out + "]";
    }
    std::string operator()(std::vector<std::string>* f) const {  // one glob: as a string
      if (f->size() == 1) return quoted((*f)[0]);
      std::string out = "[";
      for (size_t i = 0; i < f->size(); i++) out += (i ? ", " : "") + quoted((*f)[i]);
      return out + "]";
    }
    std::string operator()(std::vector<double>* f) const {
      std::string out = "[";
      for (size_t i = 0; i < f->size(); i++) out += (i ? ", " : "") + shortest_float((*f)[i], 17);
      return out + "]";
    }
  };
  return std::visit(Printer{}, field_of(cfg, key));
}

// "[train] lr = 0.0003 (cfg.toml:12:6)", the way every check names a value.
std::string mention(const Config& cfg, const Origins& origins, const std::string& id) {
  const Key& key = key_by_id(id);
  return strf("[%s] %s = %s (%s)", key.section, key.name, field_text(cfg, key).c_str(),
              origin_of(origins, id).c_str());
}

}  // namespace config_detail
