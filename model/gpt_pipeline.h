// model/gpt_pipeline.h - GPT-2 run by the pipeline executor (parallel/pipeline.h): a training
// step's micro-batches, a forward pass for validation and sampling, and where their results land.
// With pp = 1 the schedule is F0 B0 F1 B1 ... on one rank: the same path, and llm.c's order.
#pragma once
#include <vector>

#include "model/gpt.h"
#include "parallel/param_store.h"
#include "parallel/pipeline.h"

// The micro-batches of one step (or one forward pass): m consecutive B*T blocks of token ids
// and of targets on the host. targets may be null (sampling).
struct MicroBatches {
  const int* tokens = nullptr;
  const int* targets = nullptr;
  int m = 1, B = 0, T = 0;
  // [data] document_mask (model/documents.h): per micro-batch the document ids of the full rows
  // (B*T*cp) and this rank's positions inside the documents (B*T; null without
  // document_positions). Every stage uploads them.
  const int* docs = nullptr;
  const int* doc_positions = nullptr;
  // The four arrays are in device memory (a CUDA graph's step: training/cuda_graph.h), copied
  // on the device into the slots; otherwise host memory, copied up.
  bool on_device = false;
};

// A training step's forward and backward: the gradients and model.loss_sum zeroed, every
// micro-batch through this rank's stages in the schedule's order, then the reductions finished
// (parallel/param_store.h: grads_wait). The last stage adds loss_scale_for_log * sum(losses) of
// each micro-batch to model.loss_sum; dloss scales each token's gradient. What follows (norm,
// clipping, AdamW) is the optimizer's. The trainer runs it; so does the planner, dry.
void gpt_train_step(GPT& model, ParamStore& store, Pipeline& pl, const MicroBatches& mb,
                    float dloss, float loss_scale_for_log, ops::Stream s);
// One micro-batch forward through every stage. On the last stage (gpt_holds_output), the losses
// are in model.losses (with targets) and the logits in model.logits.
void gpt_pipeline_forward(GPT& model, ParamStore& store, const Pipeline& pl,
                          const MicroBatches& mb, ops::Stream s);
// This rank computes the last stage's losses and logits.
bool gpt_holds_output(const GPT& model);
