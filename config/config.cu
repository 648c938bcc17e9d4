// config/config.cu - the run configuration: a TOML file (TOML++), then `--section.key=value`
// overrides, then validation; gives a Config and the resolved config as TOML text.
//
// Schema. TOML++ has no strict mode, so each key is one line of a schema (section, key, pointer
// to the Config field, whose C++ type is the key's TOML type) and the document is walked against
// it: unknown sections/keys, wrong types and out-of-range numbers are reported at the node's
// file:line:col. An override is parsed as the TOML document `v = <value>` (3e-4, true, 8, "x";
// string keys also take a bare string) and set through the same schema line. Where each value
// came from (file:line:col, the override text, the model file) is kept, so that checks across
// keys (min_lr <= lr, ...) name every value's source. The rules of the parallel layout (the
// degrees against the model, the schedule and the world size) are config/layout_rules.cu's, and
// their messages name each value's source the same way.
//
// Errors. The problems of a phase (schema walk and overrides, then the value checks) are
// reported together through FATAL_ALL: every rank finds the same ones, rank 0 prints
// "error: ..." on stderr once, and the job exits with status 1.
//
// [init] from: missing [model] keys are read from the llm.c model file header (magic 20240326,
// version 3 = fp32 or 5 = bf16, maxT, V, L, NH, C, Vp), given ones must agree with it, and the
// file's size must match its header. The file's maxT is max_seq_len; seq_len may be shorter.
//
// Checks of this job and machine: dp*pp*cp*tp must equal world_size, globs must match files, a
// resume path must exist. world_size <= 0 (the planner, or re-reading a config stored in a
// checkpoint, maybe elsewhere) skips them and opens the model file only if a [model] key is
// missing.
//
// The resolved text lists every key in schema order, floats in the shortest form that reads back
// to the same float, so parse_config_text(cfg.toml_text) gives back the same Config.
//
// The reader is three files: this one (the file, the overrides, putting it together),
// config/config_schema.cu (the schema and the values) and config/config_checks.cu (the checks),
// plus config/layout_rules.cu (the parallel layout's rules, also used by the planner).
#include "config/config.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "kernels/common.h"
#include "config/config_schema.h"
#include "config/size_limits.h"

using namespace config_detail;

namespace {

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
  const bool is_globs_key = std::holds_alternative<std::vector<std::string>*>(key->field(cfg));
  const bool is_string_key =
      std::holds_alternative<std::string*>(key->field(cfg)) || is_globs_key;
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
  if (is_string_key &&
      (!parse_err.empty() || !(node->is_string() || (is_globs_key && node->is_array())))) {
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
// Putting it together.

std::string resolved_toml(const Config& cfg) {
  std::string text = "# resolved configuration: every key, defaults included\n";
  for (const char* section : sections()) {
    text += strf("%s[%s]\n", section == sections()[0] ? "" : "\n", section);
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
                    const char* default_backend, const LayoutCheck& more) {
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
  resolve_sharding(cfg, origins, problems);
  resolve_architecture(cfg, origins);
  problems.stop_if_any();
  Checker checker{cfg, origins, problems};
  check_values(checker);
  problems.stop_if_any();  // the layout rules below divide by the degrees
  const std::string layout = layout_problems(
      cfg, world_size, [&](const char* id) { return mention(cfg, origins, id); });
  std::istringstream lines(layout);
  for (std::string line; std::getline(lines, line);) problems.add(line);
  if (layout.empty() && more) {  // the layers above check what needs them (the schedule file)
    std::istringstream extra(more(cfg));
    for (std::string line; std::getline(extra, line);) problems.add(line);
  }
  if (check_job_and_files) check_files(checker);
  problems.stop_if_any();

  if (cfg.parallel.backend.empty()) cfg.parallel.backend = backend;
  cfg.toml_text = resolved_toml(cfg);
  return cfg;
}

}  // namespace

Config parse_config_text(const std::string& text, const std::string& source_name, int world_size,
                         const char* default_backend) {
  return build_config(text, source_name, {}, world_size, default_backend, {});
}

Config load_config(int argc, char** argv, int world_size, const char* default_backend,
                   const LayoutCheck& more) {
  std::vector<std::string> args;
  for (int i = 0; i < argc; i++)
    if (std::string(argv[i]) != "--check-config" && std::string(argv[i]) != "--sample")
      args.push_back(argv[i]);  // the caller's flags
  if (args.empty() || args[0].compare(0, 2, "--") == 0)
    FATAL_ALL("the first argument must be the config file%s (--help: the usage)",
              args.empty() ? "" : (", got '" + args[0] + "'").c_str());
  struct stat st;  // before opening: a FIFO would block the open, /dev/urandom never end
  if (stat(args[0].c_str(), &st) == 0 && S_ISDIR(st.st_mode))
    FATAL_ALL("cannot read the config file '%s': it is a directory", args[0].c_str());
  if (stat(args[0].c_str(), &st) == 0 && !S_ISREG(st.st_mode))
    FATAL_ALL("cannot read the config file '%s': not a regular file (a device, FIFO or socket)",
              args[0].c_str());
  if (stat(args[0].c_str(), &st) == 0 && st.st_size > kMaxConfigBytes)
    FATAL_ALL("cannot read the config file '%s': %lld bytes, more than the %lld a config may "
              "have", args[0].c_str(), (long long)st.st_size, (long long)kMaxConfigBytes);
  std::ifstream in(args[0], std::ios::binary);
  if (!in) FATAL_ALL("cannot read the config file '%s': %s", args[0].c_str(), std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  std::vector<std::string> overrides(args.begin() + 1, args.end());
  return build_config(text.str(), args[0], overrides, world_size, default_backend, more);
}
