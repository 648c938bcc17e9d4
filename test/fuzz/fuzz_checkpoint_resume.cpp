// test/fuzz/fuzz_checkpoint_resume.cpp - a checkpoint directory as resume reads it before any
// tensor (checkpoint/checkpoint.cu): its manifest parsed, every file it lists checked against
// its size and CRC32, and only then the index, checkpoint.h5, opened by HDF5 (format version,
// shape, seed, data position, loss trend).
//
// Input: a 4-byte little-endian length n, n bytes of manifest.txt, then the bytes of
// checkpoint.h5. The seeds are real pairs; a mutation of either is refused by the manifest (a
// size or CRC32 that no longer matches) unless it forges a matching CRC32. That gate is why a
// damaged index never reaches HDF5, whose reader is not safe on arbitrary bytes (see
// fuzz_checkpoint_index.cpp and test/fuzz/README.md).
#include <cstring>
#include <vector>

#include "checkpoint/files.h"
#include "checkpoint/hdf5_format.h"
#include "test/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz_catch_stops();
  uint32_t n = 0;
  if (size < 4) return 0;
  std::memcpy(&n, data, 4);
  if (n > size - 4) return 0;
  fuzz_file("manifest.txt", data + 4, n);
  const std::string index_path = fuzz_file("checkpoint.h5", data + 4 + n, size - 4 - n);
  try {
    std::vector<ManifestEntry> entries;
    if (!manifest_read(fuzz_dir(), &entries).empty()) return 0;
    if (!manifest_verify(fuzz_dir(), entries, 0, 1).empty()) return 0;
    CheckpointIndex index;
    CheckpointMeta meta;
    if (h5_open_index(index_path, &index, &meta).empty())
      h5_close_index(index);
  } catch (const FuzzStop&) {
  }
  return 0;
}
