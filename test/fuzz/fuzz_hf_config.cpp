// test/fuzz/fuzz_hf_config.cpp - a Hugging Face config.json as the config reader takes the
// model's shape from it ([init] from = a directory, no [model] keys but seq_len:
// config/config_hf.cu): the strict JSON reader, each key's kind and value, the refusals.
#include "config/config.h"
#include "test/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz_catch_stops();
  fuzz_file("config.json", data, size);
  const std::string text = "[init]\nfrom = \"" + fuzz_dir() + "\"\n[model]\nseq_len = 8\n"
                           "[data]\ntrain = \"x\"\n[train]\nsteps = 1\n";
  try {
    parse_config_text(text, "fuzz.toml", 0, "mpi");
  } catch (const FuzzStop&) {
  }
  return 0;
}
