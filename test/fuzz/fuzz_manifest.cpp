// test/fuzz/fuzz_manifest.cpp - a checkpoint's manifest.txt (checkpoint/files.h): parsing it,
// then verifying the files it lists (none of which exist, bar the manifest itself).
#include <vector>

#include "checkpoint/files.h"
#include "test/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz_catch_stops();
  fuzz_file("manifest.txt", data, size);
  std::vector<ManifestEntry> entries;
  try {
    if (manifest_read(fuzz_dir(), &entries).empty()) manifest_verify(fuzz_dir(), entries, 0, 1);
  } catch (const FuzzStop&) {
  }
  return 0;
}
