// test/fuzz/fuzz_checkpoint_index.cpp - a checkpoint's index, checkpoint.h5, given to HDF5
// directly (checkpoint/hdf5_read.cu: h5_open_index reads the format version, the shape, the seed,
// the data position and the loss trend), without the manifest's check that resume makes first.
// Not in `make fuzz`'s list: within seconds it finds HDF5's own bugs on crafted files (a SEGV, a
// heap overflow decoding attributes, a loop in the global heap, mallocs of sizes read from the
// file; test/fuzz/README.md). Run it by hand: make fuzz FUZZ_TARGETS=checkpoint_index.
#include "checkpoint/hdf5_format.h"
#include "test/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz_catch_stops();
  const std::string path = fuzz_file("checkpoint.h5", data, size);
  try {
    CheckpointIndex index;
    CheckpointMeta meta;
    if (h5_open_index(path, &index, &meta).empty()) h5_close_index(index);
  } catch (const FuzzStop&) {
  }
  return 0;
}
