// training/evaluate.h - forward-only uses of the model during training: the validation loss and
// printed samples. Both are collective (every rank of the run calls them: under FSDP each
// forward gathers weights from all dp ranks).
#pragma once
#include <cstdint>

#include "data/dataloader.h"
#include "data/tokenizer.h"
#include "model/gpt_pipeline.h"
#include "parallel/comm.h"

// The value the last pipeline stage holds (`local` there, ignored elsewhere), averaged over the
// dp group, on every rank of `world`.
double last_stage_mean(const GPT& model, Comm& world, double local, int dp);
// Mean loss over `batches` global micro-batches from the start of `val` (each rank its slice),
// through the pipeline, averaged over the dp group.
double validation_loss(GPT& model, ParamStore& store, const Pipeline& pl, DataLoader& val,
                       int batches, Comm& world, int dp, ops::Stream s);
// Generates `n` tokens after an end-of-text token by sampling from the softmax (temperature 1)
// with an RNG seeded by `seed`: the last pipeline stage samples, and sends each token to the
// other stages over `pp`. Returns the decoded text.
// T: the window of positions (seq_len); under context parallelism each cp rank runs its chunks
// of it, and the rank holding the last position samples and tells the others.
std::string sample_text(GPT& model, ParamStore& store, const Pipeline& pl, Comm& pp,
                        const Tokenizer& tok, int eot, int n, uint64_t seed, int T,
                        ops::Stream s);
