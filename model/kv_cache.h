// model/kv_cache.h - the key/value cache of sampling: prefill the prompt once, then one token at
// a time, each new token's attention reading the keys and values kept from earlier positions
// instead of a forward over the whole window (kernels: ops::attention_cached_forward).
//
// What is kept: per block this rank runs, (capacity, 2 NKV_local HS) in the compute dtype, rows
// [k heads | v heads] of this rank's kv heads (tensor parallelism splits them like the qkv
// GEMM's columns), RoPE already applied (Llama). Pipeline stages keep their own blocks' rows:
// the forward through the stages is the training pipeline's (model/gpt_pipeline.h) with
// B = 1 and T = the new tokens, so the activations cross stages as in training.
//
// While a cached forward runs, model.kv points here and the blocks take three detours
// (model/gpt.cu): the embedding's positions and RoPE's start at `pos`, and attention appends the
// new k, v rows to the cache and attends over rows 0 .. pos+i. Sequence parallelism is switched
// off for those passes (1 token cannot be split over tp ranks: the tp layers then all-reduce
// instead); the model's buffers hold micro_batch x seq_len tokens, which caps a prefill chunk
// (kv_cache_chunk). Context parallelism is not supported (a cp rank holds a zigzag of
// positions): the sampler recomputes the window there (training/sample.h).
#pragma once
#include <vector>

#include "model/gpt.h"
#include "parallel/param_store.h"
#include "parallel/pipeline.h"

struct KvCache {
  int capacity = 0;             // positions the cache holds (seq_len)
  int pos = 0;                  // positions filled
  std::vector<void*> layer;     // per global block: its rows, null on another stage
  int* positions = nullptr;     // 0 .. capacity-1 on the device (RoPE reads positions from pos)
  Allocator memory;
};

void kv_cache_create(KvCache& kv, const GPT& model, int capacity, ops::Stream s);
void kv_cache_destroy(KvCache& kv);
// The most tokens one cached forward may run (the model's buffers without sequence parallelism).
int kv_cache_chunk(const GPT& model);
// Runs tokens[0 .. n) at positions kv.pos .. kv.pos+n-1 through every stage (collective over the
// pipeline, as gpt_pipeline_forward), appending their keys and values; the last stage keeps the
// logits of the last one (gpt_logits_row). n <= kv_cache_chunk, kv.pos + n <= capacity.
void kv_cache_forward(GPT& model, ParamStore& store, const Pipeline& pl, KvCache& kv,
                      const int* tokens, int n, ops::Stream s);

// The detours of model/gpt.cu while model.kv is set: the token positions of the new tokens, and
// block l's attention (append k, v of qkv (n rows), then attend).
TokenPositions kv_cache_positions(const KvCache& kv, int n);
void kv_cache_attention(const GPT& model, int layer, void* out, const void* qkv, int n,
                        ops::Stream s);
