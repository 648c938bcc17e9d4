// test/fuzz/fuzz_config.cpp - the config reader (config/config.h: parse_config_text) on arbitrary
// TOML text: the schema walk, the value and layout checks, the resolved text. world_size 0, as the
// planner reads a config: no file of this machine is looked at.
#include "config/config.h"
#include "test/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz_catch_stops();
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const Config cfg = parse_config_text(text, "fuzz.toml", 0, "mpi");
    // What the trainer stores in a checkpoint must read back to the same config.
    const Config again = parse_config_text(cfg.toml_text, "resolved.toml", 0, "mpi");
    if (again.toml_text != cfg.toml_text) std::abort();
  } catch (const FuzzStop&) {
  }
  return 0;
}
