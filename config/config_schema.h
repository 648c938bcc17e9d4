// config/config_schema.h - the config reader's internals, shared by its three files (nothing
// outside config/config*.cu includes this; the interface is config/config.h):
//   config/config_schema.cu   messages, the schema (one line per key), TOML values <-> fields
//   config/config_checks.cu   the model file's shape, the value checks, the checks of this job
//   config/config_hf.cu       the model's shape from a Hugging Face directory's config.json
//   config/config.cu          the file and the overrides, and putting it together
#pragma once
#include <map>
#include <string>
#include <toml++/toml.h>
#include <variant>
#include <vector>

#include "config/config.h"

namespace config_detail {

// ---------------------------------------------------------------------------------------------
// Messages
__attribute__((format(printf, 1, 2))) std::string strf(const char* fmt, ...);

// The problems found so far; stop_if_any() reports them all and exits when there is any.
struct Problems {
  std::vector<std::string> list;
  void add(const std::string& msg) { list.push_back(msg); }
  void stop_if_any() const;
};

// Where each key got its value ("cfg.toml:12:6", "--train.lr=3e-4", "read from gpt2.bin"),
// keyed by "section.key". A key that is absent kept its default.
using Origins = std::map<std::string, std::string>;

// TOML++'s description of a syntax error, worded so that a message holds one spelling of
// "error": "Error while parsing value: ..." -> "TOML parse error while parsing value: ...".
std::string parse_problem(const toml::parse_error& e);
std::string location(const std::string& source, const toml::source_region& region);

// ---------------------------------------------------------------------------------------------
// The schema: one line per key. The field's C++ type is the key's TOML type.
using FieldRef =
    std::variant<int*, uint64_t*, float*, double*, bool*, std::string*, std::vector<int>*,
                 std::vector<std::string>*, std::vector<double>*>;

struct Key {
  const char* section;
  const char* name;
  FieldRef (*field)(Config&);
  std::vector<std::string> choices;  // string keys with a fixed set of values; else empty. A
                                     // choice ending in ':' ("file:") takes any value it starts
  std::string id() const { return std::string(section) + "." + name; }
};

const std::vector<Key>& schema();
const std::vector<const char*>& sections();  // in the order the resolved text lists them
bool is_section(const std::string& name);
const Key* find_key(const std::string& section, const std::string& name);  // nullptr: none
const Key& key_by_id(const std::string& id);  // "train.lr"; a missing one is a bug
// The keys of `section`, or with "" the sections, as a list for messages.
std::string known_names(const std::string& section);
// The message for an unknown section (name == "") or an unknown key of a known section.
std::string unknown(const std::string& where, const std::string& section, const std::string& name);
FieldRef field_of(const Config& cfg, const Key& key);

// ---------------------------------------------------------------------------------------------
// Values
const char* node_kind(const toml::node& n);
std::string expected_kind(FieldRef field);
// Stores `n` into the key's field; returns "" or what is wrong (without the location).
std::string set_field(Config& cfg, const Key& key, const toml::node& n);
std::string field_text(const Config& cfg, const Key& key);  // the value as TOML text
// "[train] lr = 0.0003 (cfg.toml:12:6)", the way every check names a value.
std::string mention(const Config& cfg, const Origins& origins, const std::string& id);

// ---------------------------------------------------------------------------------------------
// Checks (config/config_checks.cu)
// Fills missing [model] keys from the [init] from model file and checks that given ones agree
// with it (check_files false: opens the file only when a key is missing).
void resolve_model_shape(Config& cfg, Origins& origins, bool check_files, Problems& problems);
// [init] from names a directory: a Hugging Face Llama (config.json; config/config_hf.cu). Fills
// missing [model] keys from config.json and checks the given ones against it.
bool is_hf_directory(const std::string& path);
void resolve_hf_model(Config& cfg, Origins& origins, Problems& problems);

// [parallel] zero and fsdp name one choice twice (fsdp = true is zero = 3): fills the one not
// given from the other, or reports the pair when both are given and disagree.
void resolve_sharding(Config& cfg, Origins& origins, Problems& problems);
void resolve_architecture(Config& cfg, Origins& origins);

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
void check_values(Checker& c);                // the values, alone and against each other
void check_sizes(Checker& c);                 // sizes and counts (config/size_limits.cu)
void check_files(Checker& c);                 // against this machine (the files it names)

}  // namespace config_detail
