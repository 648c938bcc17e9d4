// parallel/pipeline_balance.h - how many of the model's blocks each pipeline stage holds: equal
// stages, the user's [parallel] pp_layers, or pp_balance = "auto", the split that minimises the
// slowest stage's estimated time. The estimate is the planner's device model ([plan]
// peak_tflops x matmul_efficiency for FLOPs, hbm_gbs for bytes; training/plan.cu) applied to the
// parts of a training step of one micro-batch: the embedding (on the first stage), each block,
// and the head and the loss (on the last stage). Pure arithmetic; parallel/pipeline_balance.cu.
#pragma once
#include <string>
#include <vector>

#include "config/config.h"

// The estimated milliseconds of one micro-batch's forward and backward through each part, on one
// rank (tensor, context and data parallelism divide every part alike, so they do not move the
// balance and are left out).
struct StageCosts {
  double embed = 0;           // the lookups of wte and wpe and their gradients' scatter (bytes)
  std::vector<double> block;  // per layer: the GEMMs and attention (FLOPs)
  double head = 0;            // final LayerNorm, the logits GEMM over the vocabulary (FLOPs) and
                              // the loss's passes over the logits (bytes)
};
// FLOPs of one token's forward and backward per part, the planner's count (training/metrics.h:
// 6 x parameters used + 6 x C x T per layer for attention); the parts sum to it.
struct StageFlops {
  double embed = 0;           // 6 x the wpe row and ln_f (llm.c counts every parameter)
  std::vector<double> block;  // 6 x the block's parameters one token uses + 6 C T
  double head = 0;            // 6 x Vp x C: the logits GEMM and its two gradients
};
StageFlops pipeline_part_flops(const ModelConfig& m);
StageCosts pipeline_part_costs(const Config& cfg);

// The stage times of a split (blocks per stage, model order): stage s's blocks, plus the
// embedding on stage 0 and the head on the last.
std::vector<double> pipeline_stage_times(const StageCosts& costs, const std::vector<int>& layers);
// The contiguous split of the blocks into `stages` stages of at least one block each that
// minimises the slowest stage time, and among those the most even one (the least sum of squared
// stage times): dynamic programming over the cut points.
std::vector<int> pipeline_balance(const StageCosts& costs, int stages);
// The blocks of each of the pp*pp_virtual stages the config asks for: [parallel] pp_layers, the
// auto split, or equal stages.
std::vector<int> pipeline_stage_layers(const Config& cfg);
// "blocks 3,4,4,3, estimated share 26% 24% 24% 26%": for the banner.
std::string pipeline_stage_summary(const StageCosts& costs, const std::vector<int>& layers);
