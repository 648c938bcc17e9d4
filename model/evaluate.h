// model/evaluate.h - forward-only uses of the model during training: the validation loss and
// printed samples. Both are collective (every rank of the run calls them: under FSDP each
// forward gathers weights from all dp ranks).
#pragma once
#include <cstdint>

#include "data/dataloader.h"
#include "data/tokenizer.h"
#include "model/gpt.h"
#include "parallel/comm.h"
#include "parallel/param_store.h"

// Mean loss over `batches` global micro-batches from the start of `val` (each rank its slice),
// averaged over the dp group.
double validation_loss(GPT& model, ParamStore& store, DataLoader& val, int batches, Comm& dp,
                       ops::Stream s);
// Generates `n` tokens after an end-of-text token by sampling from the softmax (temperature 1)
// with an RNG seeded by `seed`; every rank computes the same tokens. Returns the decoded text.
std::string sample_text(GPT& model, ParamStore& store, const Tokenizer& tok, int eot, int n,
                        uint64_t seed, ops::Stream s);
