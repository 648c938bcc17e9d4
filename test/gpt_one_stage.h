// test/gpt_one_stage.h - one micro-batch through a one-stage model (pp = 1), forward and whole
// backward, with the stage calls of model/gpt.h in the order the pipeline executor makes them
// for a single stage (gpt_step_begin, upload, forward, backward, gpt_step_end). The trainer
// always runs the executor (parallel/pipeline.cu); the model and FP8 gradient tests call this.
#pragma once
#include "kernels/common.h"
#include "model/gpt.h"

inline void gpt_forward_backward(GPT& m, ParamStore& store, const int* tokens, const int* targets,
                                 int B, int T, float dloss, float loss_scale_for_log,
                                 ops::Stream s) {
  CHECK(m.layout.pp.p() == 1, "gpt_forward_backward runs a one-stage model");
  StageCall c;
  c.B = B, c.T = T, c.dloss = dloss, c.loss_scale_for_log = loss_scale_for_log;
  c.last_micro_step = true;
  gpt_step_begin(m, store, true);
  gpt_upload(m, 0, tokens, targets, B, T, s);
  gpt_stage_forward(m, store, c, s);
  gpt_stage_backward(m, store, c, s);
  gpt_step_end(m, store, true);
}
