// test/fuzz/fuzz_safetensors.cpp - a safetensors file as [init] from reads it
// (checkpoint/safetensors.cu): the header length, the JSON header through the strict JSON reader
// (config/json.cu), every entry's dtype, shape and offsets; then every F32 and BF16 tensor read
// whole, which must stay inside the file.
#include <vector>

#include "checkpoint/safetensors.h"
#include "test/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz_catch_stops();
  const std::string path = fuzz_file("model.safetensors", data, size);
  SafetensorsSet set;
  if (safetensors_open_file(path, &set).empty()) {
    for (const auto& [name, t] : set.tensors) {
      if (t.dtype != "F32" && t.dtype != "BF16") continue;
      std::vector<float> values(t.numel());  // bounded: the header check ties it to the size
      safetensors_read(set, name, 0, values.size(), values.data());
    }
  }
  safetensors_close(set);
  return 0;
}
