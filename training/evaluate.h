// training/evaluate.h - forward-only uses of the model during training: the validation loss
// (printed samples: training/sample.h). Collective (every rank of the run calls them: under
// FSDP each forward gathers weights from all dp ranks).
#pragma once
#include <cstdint>
#include <vector>

#include "data/dataloader.h"
#include "model/documents.h"
#include "model/gpt_pipeline.h"
#include "parallel/comm.h"

// [data] document_mask: the documents of B full rows of T tokens for this rank (empty without
// it), and an array of them as a micro-batch field (null without it).
DocumentBatch documents_of(const GPT& m, const int* tokens, int B, int T);
const int* docs_or_null(const GPT& m, const std::vector<int>& v);

// The value the last pipeline stage holds (`local` there, ignored elsewhere), averaged over the
// dp group, on every rank of `world`.
double last_stage_mean(const GPT& model, Comm& world, double local, int dp);
// Mean loss over `batches` global micro-batches from the start of `val` (each rank its slice),
// through the pipeline, averaged over the dp group.
double validation_loss(GPT& model, ParamStore& store, const Pipeline& pl, DataLoader& val,
                       int batches, Comm& world, int dp, ops::Stream s);
