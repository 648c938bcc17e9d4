// test/fuzz/fuzz_llmc_model.cpp - the llm.c model file's header as the config reader takes the
// model's shape from it ([init] from with no [model] keys: config/config_checks.cu): magic,
// version, the shape, and the file size the shape implies.
#include "config/config.h"
#include "test/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz_catch_stops();
  const std::string model = fuzz_file("model.bin", data, size);
  const std::string text = "[init]\nfrom = \"" + model + "\"\n[data]\ntrain = \"x\"\n"
                           "[train]\nsteps = 1\n";
  try {
    parse_config_text(text, "fuzz.toml", 0, "mpi");
  } catch (const FuzzStop&) {
  }
  return 0;
}
