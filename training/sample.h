// training/sample.h - generating text from the model: printed samples during training and
// `train --sample` (a checkpoint or a Hugging Face directory). Collective: every rank of the run
// calls it (under FSDP each forward gathers weights from all dp ranks).
//
// Two ways to run the model, the same tokens at temperature 0 (test/test_sample.py):
//   KV cache (default, [log] sample_kv_cache): the prompt is prefilled once, then each new token
//     is one forward of one token whose attention reads the cached keys and values
//     (model/kv_cache.h). When the window of seq_len positions is full, the cache restarts with
//     the last half of the tokens as the prompt. Not under context parallelism.
//   Recompute: every new token runs the whole window of the last seq_len tokens (positions after
//     the current length hold end-of-text; causal attention keeps them out). Also the way under
//     context parallelism: each cp rank runs its chunks and the one holding the last position
//     samples.
// The choice of the next token: greedy at temperature 0, else softmax(logits / temperature),
// restricted to the top_k most likely tokens when top_k > 0, drawn with one uniform number per
// token from an RNG seeded by `seed` (drawn on every rank, so all ranks' generators agree). The
// last pipeline stage samples and sends each token to the other stages over `pp`.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "config/config.h"
#include "data/tokenizer.h"
#include "model/gpt_pipeline.h"
#include "parallel/comm.h"

struct SampleSettings {
  int tokens = 64;          // tokens to generate
  uint64_t seed = 0;
  double temperature = 1.0;
  int top_k = 0;
  bool kv_cache = true;
  int window = 0;           // positions the model sees (seq_len)
};
// [log]'s sample keys, with the model's window.
SampleSettings sample_settings(const Config& cfg, uint64_t seed);

// Generates settings.tokens tokens after `prompt` (token ids; at least one, e.g. an end-of-text).
// Returns the generated ids (not the prompt's), the same on every rank.
std::vector<int> sample_tokens(GPT& model, ParamStore& store, const Pipeline& pl, Comm& pp,
                               const std::vector<int>& prompt, const SampleSettings& settings,
                               ops::Stream s);
// The same after one end-of-text token, decoded.
std::string sample_text(GPT& model, ParamStore& store, const Pipeline& pl, Comm& pp,
                        const Tokenizer& tok, int eot, const SampleSettings& settings,
                        ops::Stream s);
// The next token from a row of logits: u01 is the uniform draw in [0, 1) (unused at
// temperature 0).
int choose_token(const std::vector<float>& logits, double u01, double temperature, int top_k);
