// training/optimizer.h - the learning-rate schedule and the AdamW step (with gradient clipping) over
// whatever shards this rank owns.
#pragma once
#include "config/config.h"
#include "model/gpt.h"
#include "parallel/param_store.h"

// Learning rate of optimizer step `step` (1-based): linear warmup over warmup_steps to lr, then
// "cosine" decays to min_lr at the last step, or "constant" stays at lr.
float learning_rate(const TrainConfig& t, int step);
// AdamW on this rank's shard of every unit: decayed ranges with weight_decay, the rest without;
// writes the compute-dtype working copy where the store keeps one, and leaves the new weights
// where the model reads them (ZeRO-1/2 gather them, offload copies them up). The planner runs it
// too, dry: its collectives and copies are part of a step.
// `step`: this update's number, 1-based (Adam's bias corrections): the step number minus the
// updates skipped as loss spikes (training/health.h).
// The gradients are multiplied by the clipping factor grad_norm (parallel/param_store.h) left in
// store.clip_factor on the device; the planner's dry step reads none.
void optimizer_step(ParamStore& store, const GPTLayout& layout, const TrainConfig& t, int step,
                    float lr);
