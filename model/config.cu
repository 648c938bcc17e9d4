// model/config.cu - the run configuration: a TOML file (TOML++), then `--section.key=value`
// overrides, then validation; gives a Config and the resolved config as TOML text.
//
// Schema. TOML++ has no strict mode, so each key is one line of a schema (section, key, pointer
// to the Config field, whose C++ type is the key's TOML type) and the document is walked against
// it: unknown sections/keys, wrong types and out-of-range numbers are reported at the node's
// file:line:col. An override is parsed as the TOML document `v = <value>` (3e-4, true, 8, "x";
// string keys also take a bare string) and set through the same schema line. Where each value
// came from (file:line:col, the override text, the model file) is kept, so that checks across
// keys (min_lr <= lr, the degrees against the world size, ...) name every value's source. Checks
// of the layout against the model (n_head % tp, seq_len % (2*cp), ...) are parallel/mesh.cu's.
//
// Errors. The problems of a phase (schema walk and overrides, then the value checks) are
// reported together through FATAL_ALL: every rank finds the same ones, rank 0 prints
// "error: ..." on stderr once, and the job exits with status 1.
//
// [init] from: missing [model] keys are read from the llm.c model file header (magic 20240326,
// version 3 = fp32 or 5 = bf16, maxT, V, L, NH, C, Vp), given ones must agree with it, and the
// file's size must match its header. The file's maxT is max_seq_len; seq_len may be shorter.
//
// Checks of this job and machine: globs must match files, a resume path must exist, and
// dp*tp*pp*cp must equal world_size. world_size <= 0 (re-reading a config stored in a checkpoint,
// maybe elsewhere) skips them and opens the model file only if a [model] key is missing.
//
// The resolved text lists every key in schema order, floats in the shortest form that reads back
// to the same float, so parse_config_text(cfg.toml_text) gives back the same Config.
#include "model/config.h"

#include <glob.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cfloat>
#include <climits>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <toml++/toml.h>
#include <variant>
#include <vector>

#include "kernels/common.h"

namespace {

// ---------------------------------------------------------------------------------------------
// Messages

__attribute__((format(printf, 1, 2))) std::string strf(const char* fmt, ...) {
  va_list args, again;
  va_start(args, fmt);
  va_copy(again, args);
  std::string out(std::vsnprintf(nullptr, 0, fmt, args), '\0');
  std::vsnprintf(&out[0], out.size() + 1, fmt, again);
  va_end(again);
  va_end(args);
  return out;
}

// The problems found so far; stop_if_any() reports them all and exits when there is any.
struct Problems {
  std::vector<std::string> list;
  void add(const std::string& msg) { list.push_back(msg); }
  void stop_if_any() const {
    if (list.empty()) return;
    if (list.size() == 1) FATAL_ALL("%s", list[0].c_str());
    std::string all = strf("invalid configuration, %zu problems:", list.size());
    for (const std::string& msg : list) all += "\n  - " + msg;
    FATAL_ALL("%s", all.c_str());
  }
};

// Where each key got its value ("cfg.toml:12:6", "--train.lr=3e-4", "read from gpt2.bin"),
// keyed by "section.key". A key that is absent kept its default.
using Origins = std::map<std::string, std::string>;

std::string origin_of(const Origins& origins, const std::string& id) {
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

using FieldRef = std::variant<int*, uint64_t*, float*, double*, bool*, std::string*>;

struct Key {
  const char* section;
  const char* name;
  FieldRef (*field)(Config&);
  std::vector<std::string> choices;  // string keys with a fixed set of values; else empty
  std::string id() const { return std::string(section) + "." + name; }
};

#define KEY(sec, key, ...) Key{#sec, #key, [](Config& c) -> FieldRef { return &c.sec.key; }, \
                                {__VA_ARGS__}}

const std::vector<Key>& schema() {  // function-local static: built once, read-only
  static const std::vector<Key> keys = {
      KEY(model, n_layer), KEY(model, n_head), KEY(model, d_model), KEY(model, seq_len),
      KEY(model, max_seq_len), KEY(model, vocab_size), KEY(model, n_experts),
      KEY(model, top_k), KEY(model, moe_every), KEY(model, d_expert),
      KEY(init, from),
      KEY(data, train), KEY(data, val), KEY(data, shuffle), KEY(data, tokenizer),
      KEY(train, micro_batch), KEY(train, grad_accum), KEY(train, steps), KEY(train, lr),
      KEY(train, warmup_steps), KEY(train, lr_schedule, "cosine", "constant"),
      KEY(train, min_lr), KEY(train, weight_decay), KEY(train, grad_clip), KEY(train, beta1),
      KEY(train, beta2), KEY(train, eps), KEY(train, seed),
      KEY(train, recompute, "none", "gelu", "block"), KEY(train, moe_aux_loss),
      KEY(train, moe_z_loss),
      KEY(parallel, dp), KEY(parallel, tp), KEY(parallel, pp), KEY(parallel, cp),
      KEY(parallel, ep), KEY(parallel, sp), KEY(parallel, fsdp),
      KEY(parallel, pp_schedule, "1f1b", "gpipe", "interleaved"), KEY(parallel, pp_virtual), KEY(parallel, backend, "nccl", "mpi", ""),
      KEY(precision, compute, "fp32", "bf16", "fp8"),
      KEY(precision, fp8_recipe, "tensorwise", "delayed"), KEY(precision, fp8_amax_history),
      KEY(precision, fp8_margin),
      KEY(kernels, attention, "auto", "flash", "cudnn"),
      KEY(checkpoint, dir), KEY(checkpoint, every), KEY(checkpoint, keep),
      KEY(checkpoint, resume),
      KEY(log, every), KEY(log, metrics), KEY(log, val_every), KEY(log, val_batches),
      KEY(log, sample_every), KEY(log, sample_tokens), KEY(log, peak_tflops),
      KEY(log, pipeline_timeline), KEY(log, check_tied),
      KEY(plan, peak_tflops), KEY(plan, matmul_efficiency), KEY(plan, hbm_gbs),
      KEY(plan, intra_node_gbs), KEY(plan, inter_node_gbs), KEY(plan, gpus_per_node),
      KEY(plan, memory_gib),
  };
  return keys;
}
#undef KEY

const char* const kSections[] = {"model",     "init",    "data",       "train", "parallel",
                                 "precision", "kernels", "checkpoint", "log",   "plan"};

bool is_section(const std::string& name) {
  return std::find(std::begin(kSections), std::end(kSections), name) != std::end(kSections);
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
  for (const char* s : kSections)
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

std::string list_choices(const Key& key) {  // "\"cosine\", \"constant\""
  std::string out;
  for (const std::string& c : key.choices) out += (out.empty() ? "\"" : ", \"") + c + "\"";
  return out;
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

std::string node_text(const toml::node& n) {
  if (!n.is_value()) return node_kind(n);
  std::ostringstream os;
  os << toml::node_view<const toml::node>(&n);
  return std::string(node_kind(n)) + " (" + os.str() + ")";
}

std::string expected_kind(FieldRef field) {
  const char* kinds[] = {"an integer", "an integer >= 0", "a number", "a number", "true or false",
                         "a string"};  // in the order of FieldRef's alternatives
  return kinds[field.index()];
}

// Reads a number for a float key: an integer literal is fine too.
std::string read_number(const toml::node& n, double* out) {
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
      if (!key.choices.empty() &&
          std::find(key.choices.begin(), key.choices.end(), v) == key.choices.end())
        return "\"" + v + "\" is not one of " + list_choices(key);
      *f = v;
      return "";
    }
  };
  return std::visit(Setter{key, n}, key.field(cfg));
}

// A TOML basic string: quoted, with \, " and control characters escaped.
std::string quoted(const std::string& s) {
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
std::string shortest_float(T v, int max_digits) {
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
  };
  return std::visit(Printer{}, field_of(cfg, key));
}

// "[train] lr = 0.0003 (cfg.toml:12:6)", the way every check names a value.
std::string mention(const Config& cfg, const Origins& origins, const std::string& id) {
  const Key& key = key_by_id(id);
  return strf("[%s] %s = %s (%s)", key.section, key.name, field_text(cfg, key).c_str(),
              origin_of(origins, id).c_str());
}

// ---------------------------------------------------------------------------------------------
// The file and the overrides.

void apply_section(const std::string& section, const toml::table& table,
                   const std::string& source, Config& cfg, Origins& origins, Problems& problems) {
  for (auto&& [name, node] : table) {
    const Key* key = find_key(section, std::string(name.str()));
    if (!key) {
      problems.add(unknown(location(source, name.source()), section, std::string(name.str())));
      continue;
    }
    std::string where = location(source, node.source());
    std::string err = set_field(cfg, *key, node);
    if (!err.empty()) problems.add(strf("[%s] %s (%s): %s", key->section, key->name,
                                        where.c_str(), err.c_str()));
    origins[key->id()] = where;  // given, even if wrong: a wrong value stops before the checks
  }
}

void apply_document(const toml::table& doc, const std::string& source, Config& cfg,
                    Origins& origins, Problems& problems) {
  for (auto&& [name, node] : doc) {
    std::string section(name.str());
    std::string where = location(source, name.source());
    if (!node.is_table()) {
      problems.add(is_section(section)
                       ? strf("%s: [%s] must be a table, got %s", where.c_str(), section.c_str(),
                              node_kind(node))
                       : strf("%s: key '%s' outside any section (sections: %s)", where.c_str(),
                              section.c_str(), known_names("").c_str()));
    } else if (!is_section(section)) {
      problems.add(unknown(where, section, ""));
    } else {
      apply_section(section, *node.as_table(), source, cfg, origins, problems);
    }
  }
}

// `--section.key=value`; the override text itself is the location in every message.
void apply_override(const std::string& arg, Config& cfg, Origins& origins, Problems& problems) {
  size_t eq = arg.find('='), dot = arg.find('.');
  if (arg.compare(0, 2, "--") != 0 || eq == std::string::npos || dot == std::string::npos ||
      dot > eq) {
    problems.add(strf("%s: malformed override, expected --section.key=value", arg.c_str()));
    return;
  }
  std::string section = arg.substr(2, dot - 2), name = arg.substr(dot + 1, eq - dot - 1);
  std::string value = arg.substr(eq + 1);
  const Key* key = find_key(section, name);
  if (!key) {
    problems.add(unknown(arg, section, is_section(section) ? name : ""));
    return;
  }
  bool is_string_key = std::holds_alternative<std::string*>(key->field(cfg));
  toml::table doc;
  std::string parse_err;
  try {
    doc = toml::parse(std::string_view("v = " + value), std::string_view(arg));
    if (doc.size() != 1) parse_err = "more than one value";
  } catch (const toml::parse_error& e) {
    parse_err = parse_problem(e);
  }
  const toml::node* node = doc.get("v");
  std::string err;
  if (is_string_key && (!parse_err.empty() || !node->is_string())) {
    toml::value<std::string> bare(value);  // a bare unquoted string
    err = set_field(cfg, *key, bare);
  } else if (!parse_err.empty()) {
    err = "expects " + expected_kind(key->field(cfg)) + ", got '" + value +
          "', which is not a TOML value (" + parse_err + ")";
  } else {
    err = set_field(cfg, *key, *node);
  }
  if (!err.empty()) problems.add(strf("%s: [%s] %s: %s", arg.c_str(), key->section, key->name,
                                      err.c_str()));
  origins[key->id()] = arg;
}

// ---------------------------------------------------------------------------------------------
// [init] from: the model shape from an llm.c model file.

struct ModelFileShape {
  int version = 0, maxT = 0, V = 0, L = 0, NH = 0, C = 0, Vp = 0;
};

// Reads and checks the header; returns "" or what is wrong with the file.
std::string read_model_header(const std::string& path, ModelFileShape* shape) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return strf("cannot open the file: %s", std::strerror(errno));
  int32_t h[256] = {0};
  size_t got = std::fread(h, sizeof(int32_t), 256, f);
  std::fseek(f, 0, SEEK_END);
  long bytes = std::ftell(f);
  std::fclose(f);
  if (got != 256) return strf("not an llm.c model file: %ld bytes, shorter than the header", bytes);
  if (h[0] != 20240326) return strf("not an llm.c model file: magic %d, expected 20240326", h[0]);
  if (h[1] != 3 && h[1] != 5)
    return strf("llm.c model file version %d, expected 3 (fp32) or 5 (bf16)", h[1]);
  *shape = ModelFileShape{h[1], h[2], h[3], h[4], h[5], h[6], h[7]};
  const ModelFileShape& s = *shape;
  if (s.maxT <= 0 || s.V <= 0 || s.L <= 0 || s.NH <= 0 || s.C <= 0 ||
      s.Vp != (s.V + 127) / 128 * 128)
    return strf("malformed header: maxT=%d V=%d L=%d NH=%d C=%d Vp=%d (sizes must be positive, "
                "Vp = V rounded up to a multiple of 128)", s.maxT, s.V, s.L, s.NH, s.C, s.Vp);
  int64_t C = s.C;  // llm.c's parameter count: wte, wpe, L blocks, ln_f
  int64_t params = (int64_t)s.Vp * C + (int64_t)s.maxT * C + s.L * (12 * C * C + 13 * C) + 2 * C;
  int64_t expected = 1024 + params * (s.version == 3 ? 4 : 2);
  if (bytes != expected)
    return strf("the file has %ld bytes, but its header (L=%d NH=%d C=%d maxT=%d Vp=%d, "
                "version %d) needs %lld", bytes, s.L, s.NH, s.C, s.maxT, s.Vp, s.version,
                (long long)expected);
  return "";
}

// Fills missing [model] keys from the model file and checks that given ones agree with it. The
// file's maxT is the model's max_seq_len (its wpe rows); seq_len, the length trained at, may be
// anything up to it and defaults to it. Without a file, max_seq_len defaults to seq_len.
// `check_files` false: a model file is opened only when a key is missing.
void resolve_model_shape(Config& cfg, Origins& origins, bool check_files, Problems& problems) {
  const char* names[] = {"n_layer", "n_head", "d_model", "max_seq_len", "vocab_size"};
  int* fields[] = {&cfg.model.n_layer, &cfg.model.n_head, &cfg.model.d_model,
                   &cfg.model.max_seq_len, &cfg.model.vocab_size};
  auto given = [&](const char* name) { return origins.count(std::string("model.") + name) > 0; };
  bool all_given = given("seq_len");
  for (const char* name : {"n_layer", "n_head", "d_model", "seq_len", "vocab_size"}) {
    all_given &= given(name);
    if (!given(name) && cfg.init.from.empty())
      problems.add(strf("missing required key [model] %s in %s (required unless [init] from "
                        "names an llm.c model file)", name, cfg.path.c_str()));
  }
  if (cfg.init.from.empty()) {
    if (!given("max_seq_len")) cfg.model.max_seq_len = cfg.model.seq_len;
    return;
  }
  if (all_given && given("max_seq_len") && !check_files) return;
  ModelFileShape s;
  std::string err = read_model_header(cfg.init.from, &s);
  if (!err.empty()) {
    problems.add(mention(cfg, origins, "init.from") + ": " + err);
    return;
  }
  int file[] = {s.L, s.NH, s.C, s.maxT, s.V};
  std::string file_shape, config_shape;
  bool agree = true;
  for (int i = 0; i < 5; i++) {
    std::string id = std::string("model.") + names[i];
    file_shape += strf(" %s=%d", names[i], file[i]);
    if (origins.count(id)) {
      config_shape += strf(" %s=%d (%s)", names[i], *fields[i], origins[id].c_str());
      agree &= *fields[i] == file[i];
    } else {
      *fields[i] = file[i];
      origins[id] = "read from " + cfg.init.from;
    }
  }
  if (!agree)
    problems.add(strf("[model] disagrees with the model file %s: the file has%s; the config "
                      "has%s", mention(cfg, origins, "init.from").c_str(), file_shape.c_str(),
                      config_shape.c_str()));
  if (!given("seq_len")) {
    cfg.model.seq_len = s.maxT;
    origins["model.seq_len"] = "read from " + cfg.init.from;
  }
}

// ---------------------------------------------------------------------------------------------
// Value checks.

struct Checker {
  const Config& cfg;
  const Origins& origins;
  Problems& problems;
  void require(bool ok, const char* id, const std::string& rule) {
    if (!ok) problems.add(mention(cfg, origins, id) + ": " + rule);
  }
  int int_value(const char* id) { return *std::get<int*>(field_of(cfg, key_by_id(id))); }
  double float_value(const char* id) {
    FieldRef f = field_of(cfg, key_by_id(id));
    return std::holds_alternative<float*>(f) ? *std::get<float*>(f) : *std::get<double*>(f);
  }
};

// FP8 GEMMs need every matrix dimension to be a multiple of 16 (cuBLASLt's FP8 rule on Hopper):
// the channels per tensor-parallel rank d_model/tp (then also 3 and 4 times it) and the tokens
// of a micro-batch, micro_batch * seq_len (the depth of the weight-gradient GEMM).
void check_fp8_shapes(Checker& c) {
  const Config& cfg = c.cfg;
  if (cfg.precision.compute != "fp8") return;
  const int tp = std::max(1, cfg.parallel.tp);
  if (cfg.model.d_model > 0 && (cfg.model.d_model % tp != 0 || (cfg.model.d_model / tp) % 16))
    c.problems.add(mention(cfg, c.origins, "precision.compute") + " needs d_model/tp to be a "
                   "multiple of 16 (FP8 GEMM dimensions), got " +
                   mention(cfg, c.origins, "model.d_model") + " / " +
                   mention(cfg, c.origins, "parallel.tp"));
  const long tokens = (long)cfg.train.micro_batch * cfg.model.seq_len;
  if (tokens > 0 && tokens % 16 != 0)
    c.problems.add(mention(cfg, c.origins, "precision.compute") + " needs micro_batch * seq_len "
                   "to be a multiple of 16 (the depth of the FP8 weight-gradient GEMM), got " +
                   mention(cfg, c.origins, "train.micro_batch") + " * " +
                   mention(cfg, c.origins, "model.seq_len"));
}

// Mixture of experts: the [model] keys and what they need of the rest of the config.
void check_experts(Checker& c) {
  const Config& cfg = c.cfg;
  const ModelConfig& m = cfg.model;
  auto key = [&](const char* id) { return mention(cfg, c.origins, id); };
  c.require(m.n_experts >= 0, "model.n_experts", "must be >= 0 (0 = a dense model)");
  c.require(m.d_expert >= 0, "model.d_expert", "must be >= 0 (0 = 4 * d_model)");
  if (m.n_experts <= 0) {
    if (cfg.parallel.ep > 1)
      c.problems.add(key("parallel.ep") + " needs experts to shard: set [model] n_experts "
                     "(a multiple of ep), or ep = 1 for a dense model");
    return;
  }
  c.require(m.top_k >= 1 && m.top_k <= m.n_experts, "model.top_k",
            strf("must be between 1 and [model] n_experts = %d", m.n_experts));
  c.require(m.moe_every >= 1 && m.moe_every <= std::max(1, m.n_layer), "model.moe_every",
            strf("must be between 1 and [model] n_layer = %d (block l is an MoE block when "
                 "(l + 1) %% moe_every == 0)", m.n_layer));
  if (cfg.parallel.ep > 0 && m.n_experts % cfg.parallel.ep != 0)
    c.problems.add(key("model.n_experts") + " is not a multiple of " + key("parallel.ep") +
                   " (each expert-parallel rank holds n_experts/ep experts)");
  if (!cfg.init.from.empty())
    c.problems.add(key("init.from") + " names an llm.c model, which is dense; it cannot start "
                   "a model with " + key("model.n_experts"));
}

void check_values(Checker& c) {
  const Config& cfg = c.cfg;
  for (const char* id : {"model.n_layer", "model.n_head", "model.d_model", "model.seq_len",
                         "model.max_seq_len", "model.vocab_size", "train.micro_batch",
                         "train.grad_accum", "train.steps", "parallel.dp", "parallel.tp",
                         "parallel.pp", "parallel.cp", "parallel.ep", "log.every",
                         "log.val_batches", "log.sample_tokens", "precision.fp8_amax_history",
                         "parallel.pp_virtual", "plan.gpus_per_node"})
    c.require(c.int_value(id) > 0, id, "must be positive");
  for (const char* id : {"train.warmup_steps", "checkpoint.every", "log.val_every",
                         "log.sample_every", "precision.fp8_margin"})
    c.require(c.int_value(id) >= 0, id, "must be >= 0");
  for (const char* id : {"train.lr", "train.min_lr", "train.weight_decay", "train.grad_clip",
                         "log.peak_tflops", "train.moe_aux_loss", "train.moe_z_loss"})
    c.require(c.float_value(id) >= 0, id, "must be >= 0");
  for (const char* id : {"plan.peak_tflops", "plan.matmul_efficiency", "plan.hbm_gbs",
                         "plan.intra_node_gbs", "plan.inter_node_gbs", "plan.memory_gib"})
    c.require(c.float_value(id) > 0, id, "must be > 0");
  for (const char* id : {"train.beta1", "train.beta2"})
    c.require(c.float_value(id) >= 0 && c.float_value(id) < 1, id, "must be in [0, 1)");
  c.require(cfg.train.eps > 0, "train.eps", "must be > 0");
  c.require(cfg.checkpoint.keep >= 1, "checkpoint.keep", "must be >= 1");
  if (cfg.model.n_head > 0 && cfg.model.d_model % cfg.model.n_head != 0)
    c.problems.add(mention(cfg, c.origins, "model.n_head") + " does not divide " +
                   mention(cfg, c.origins, "model.d_model"));
  if (cfg.model.seq_len > 0 && cfg.model.seq_len > cfg.model.max_seq_len)
    c.problems.add(mention(cfg, c.origins, "model.seq_len") + " exceeds " +
                   mention(cfg, c.origins, "model.max_seq_len") + ": a run uses the first "
                   "seq_len rows of the position table (wpe), which has max_seq_len rows, so "
                   "seq_len must be <= max_seq_len (for random init, raise [model] max_seq_len)");
  if (cfg.train.min_lr > cfg.train.lr)
    c.problems.add(mention(cfg, c.origins, "train.min_lr") + " is greater than " +
                   mention(cfg, c.origins, "train.lr"));
  if (cfg.log.val_every > 0 && cfg.data.val.empty())
    c.problems.add(mention(cfg, c.origins, "log.val_every") + " needs [data] val (validation "
                   "shards), which is not set");
  if (cfg.checkpoint.resume == "latest" && cfg.checkpoint.dir.empty())
    c.problems.add(mention(cfg, c.origins, "checkpoint.resume") + " needs [checkpoint] dir");
  check_fp8_shapes(c);
  check_experts(c);
  const ParallelConfig& p = cfg.parallel;
  if (p.ep > 0 && p.dp > 0 && p.cp > 0 && (p.dp * p.cp) % p.ep != 0)
    c.problems.add(mention(cfg, c.origins, "parallel.ep") + strf(" does not divide dp*cp = %d",
                   p.dp * p.cp) + " (" + mention(cfg, c.origins, "parallel.dp") + ", " +
                   mention(cfg, c.origins, "parallel.cp") + ")");
}

// The checks that need this job (world size) and this machine (files).
void check_job(Checker& c, int world_size) {
  const Config& cfg = c.cfg;
  const ParallelConfig& p = cfg.parallel;
  long long product = (long long)p.dp * p.tp * p.pp * p.cp;
  std::string degrees;
  for (const char* id : {"parallel.dp", "parallel.tp", "parallel.pp", "parallel.cp"})
    degrees += (degrees.empty() ? "" : ", ") + mention(cfg, c.origins, id);
  if (product != world_size)
    c.problems.add(strf("the parallel degrees multiply to dp*tp*pp*cp = %lld, but the job has "
                        "world size %d: ", product, world_size) + degrees +
                   " (ep is not a factor of the world: it lives inside dp*cp)");
  for (const char* id : {"data.train", "data.val"}) {
    const std::string& pattern = *std::get<std::string*>(field_of(cfg, key_by_id(id)));
    if (pattern.empty() && std::string(id) == "data.val") continue;
    glob_t g;
    int rc = glob(pattern.c_str(), 0, nullptr, &g);
    size_t matches = rc == 0 ? g.gl_pathc : 0;
    if (rc == 0) globfree(&g);
    c.require(matches > 0, id, "the pattern matches no file");
  }
  const std::string& resume = cfg.checkpoint.resume;
  struct stat st;
  if (!resume.empty() && resume != "latest")
    c.require(stat(resume.c_str(), &st) == 0, "checkpoint.resume",
              "no such checkpoint (expected \"\", \"latest\" or an existing path)");
}

// ---------------------------------------------------------------------------------------------
// Putting it together.

std::string resolved_toml(const Config& cfg) {
  std::string text = "# resolved configuration: every key, defaults included\n";
  for (const char* section : kSections) {
    text += strf("%s[%s]\n", section == kSections[0] ? "" : "\n", section);
    for (const Key& key : schema()) {
      if (std::string(section) != key.section) continue;
      text += strf("%s = %s", key.name, field_text(cfg, key).c_str());
      if (key.id() == "model.vocab_size")
        text += strf("  # padded to %d internally", cfg.model.padded_vocab());
      text += "\n";
    }
  }
  return text;
}

toml::table parse_document(const std::string& text, const std::string& source) {
  try {
    return toml::parse(std::string_view(text), std::string_view(source));
  } catch (const toml::parse_error& e) {
    FATAL_ALL("%s: %s", location(source, e.source()).c_str(),
              parse_problem(e).c_str());
  }
}

Config build_config(const std::string& text, const std::string& source,
                    const std::vector<std::string>& overrides, int world_size,
                    const char* default_backend) {
  std::string backend = default_backend ? default_backend : "";
  if (backend != "nccl" && backend != "mpi")
    BUG("default backend must be \"nccl\" or \"mpi\", got \"%s\"", backend.c_str());
  Config cfg;
  cfg.path = source;
  Origins origins;
  Problems problems;
  apply_document(parse_document(text, source), source, cfg, origins, problems);
  for (const std::string& arg : overrides) apply_override(arg, cfg, origins, problems);
  if (!origins.count("data.train"))
    problems.add(strf("missing required key [data] train in %s", source.c_str()));
  if (!origins.count("train.steps"))
    problems.add(strf("missing required key [train] steps in %s", source.c_str()));
  problems.stop_if_any();

  bool check_job_and_files = world_size > 0;
  resolve_model_shape(cfg, origins, check_job_and_files, problems);
  problems.stop_if_any();
  Checker checker{cfg, origins, problems};
  check_values(checker);
  if (check_job_and_files) check_job(checker, world_size);
  problems.stop_if_any();

  if (cfg.parallel.backend.empty()) cfg.parallel.backend = backend;
  cfg.toml_text = resolved_toml(cfg);
  return cfg;
}

}  // namespace

Config parse_config_text(const std::string& text, const std::string& source_name, int world_size,
                         const char* default_backend) {
  return build_config(text, source_name, {}, world_size, default_backend);
}

Config load_config(int argc, char** argv, int world_size, const char* default_backend) {
  std::vector<std::string> args;
  for (int i = 0; i < argc; i++)
    if (std::string(argv[i]) != "--check-config") args.push_back(argv[i]);  // the caller's flag
  if (args.empty() || args[0].compare(0, 2, "--") == 0)
    FATAL_ALL("usage: <config.toml> [--section.key=value ...] [--check-config]: the first argument "
          "must be the config file%s", args.empty() ? "" : (", got '" + args[0] + "'").c_str());
  std::ifstream in(args[0], std::ios::binary);
  if (!in) FATAL_ALL("cannot read the config file '%s': %s", args[0].c_str(), std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  std::vector<std::string> overrides(args.begin() + 1, args.end());
  return build_config(text.str(), args[0], overrides, world_size, default_backend);
}
