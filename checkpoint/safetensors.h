// checkpoint/safetensors.h - Hugging Face's safetensors files, read (and written, for tests).
//
// The format: an 8-byte little-endian unsigned header length n; n bytes of JSON, an object
// {tensor name: {"dtype": "F32" | "BF16" | ..., "shape": [d0, d1, ...], "data_offsets":
// [begin, end]}} with an optional "__metadata__" object of strings; then the data, each tensor
// row-major little-endian at [begin, end) counted from the end of the header. A model too big
// for one file is split into shards named by model.safetensors.index.json, whose "weight_map"
// maps every tensor name to its shard's file name.
//
// Reading is strict, since a file may come from anywhere: the header is parsed by the strict
// JSON reader (config/json.h); every entry must have exactly those three keys, a known dtype,
// non-negative integer dimensions and offsets inside the data with end - begin equal to the
// element count times the element size; __metadata__ values must be strings; a tensor name may
// appear in one shard only, and the index and the shards must agree. Every error names the file
// and the byte offset. Tensors are read on demand with pread, so a rank reads only the rows it
// holds; F32 is copied and BF16 widened exactly (its 16 bits are the top half of an fp32).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

struct SafetensorsTensor {
  std::string dtype;            // "F32", "BF16", "F16", ...
  std::vector<int64_t> shape;
  int file = 0;                 // index into SafetensorsSet::files
  uint64_t begin = 0, end = 0;  // absolute byte offsets in that file
  size_t numel() const;
};

struct SafetensorsFile {
  std::string path;
  int fd = -1;
};

// One model.safetensors, or the shards an index names: every tensor by name.
struct SafetensorsSet {
  std::vector<SafetensorsFile> files;
  std::map<std::string, SafetensorsTensor> tensors;
};

// Each returns "" or what is wrong (naming the file and, for a malformed one, the byte offset).
// Adds one file's tensors to *set.
std::string safetensors_open_file(const std::string& path, SafetensorsSet* set);
// DIR/model.safetensors.index.json and its shards if present, else DIR/model.safetensors.
std::string safetensors_open_dir(const std::string& dir, SafetensorsSet* set);
void safetensors_close(SafetensorsSet& set);
// count elements of tensor `name` starting at row-major element `first`, as fp32 (F32 or BF16).
std::string safetensors_read(const SafetensorsSet& set, const std::string& name, size_t first,
                             size_t count, float* dst);

// Writing (tests): tensors in the given order, "F32" or "BF16" (rounded to nearest even).
struct SafetensorsOut {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::vector<float> values;
};
std::string safetensors_write(const std::string& path, const std::vector<SafetensorsOut>& tensors);
