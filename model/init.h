// model/init.h - where the first weights come from: GPT-2's random init from a counter-based RNG,
// or an llm.c model file. Both are ParamFills (parallel/param_store.h): "write elements
// [first, first+count) of logical tensor t", so that every layout - one rank, DDP, any FSDP
// shard, any tensor-parallel block - reads exactly the same values.
#pragma once
#include <cstdint>
#include <string>

#include "model/gpt.h"
#include "parallel/placement.h"

// A stable 64-bit id of a tensor name (FNV-1a): the RNG key, independent of the layout.
uint64_t tensor_key(const std::string& name);
// N(0,1) sample number `index` of stream (seed, key): a pure function, no state.
float counter_normal(uint64_t seed, uint64_t key, uint64_t index);

// GPT-2 init, as in GPT-2 and llm.c: weight matrices and embeddings N(0, 0.02), the two output
// projections of each block N(0, 0.02/sqrt(2 n_layer)), biases 0, LayerNorm weights 1. Here:
// N(0, init_std) for the first init_rows rows, else the tensor's constant.
ParamFill random_init_fill(uint64_t seed);

// llm.c model file (magic 20240326; version 3 = fp32, 5 = bf16). Checks the header against the
// layout and exits naming the file on a mismatch. The file is read with pread per request.
struct LlmcModelFile {
  std::string path;
  int fd = -1;
  int version = 0;
  int maxT = 0, V = 0, L = 0, NH = 0, C = 0, Vp = 0;
};
LlmcModelFile llmc_open(const std::string& path, const GPTLayout& layout);
void llmc_close(LlmcModelFile& f);
ParamFill llmc_fill(const LlmcModelFile& f, const GPTLayout& layout);
// Element offset of tensor `t` (by name) in the llm.c file's concatenated parameter array.
size_t llmc_tensor_offset(const GPTLayout& layout, const TensorPlacement& t);
