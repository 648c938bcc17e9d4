// model/gpt_pipeline.cu - the GPT's stages as the pipeline executor sees them
// (model/gpt_pipeline.h): a compute action becomes gpt_stage_forward / gpt_stage_backward on a
// slot, and boundary messages land in the slot's input and gradient buffers.
#include "model/gpt_pipeline.h"

bool gpt_holds_output(const GPT& m) {
  const GPTLayout& g = m.layout;
  return g.last_stage(g.pp.v - 1);
}

static PipelineStages stages_of(GPT& m, ParamStore& store, const MicroBatches& mb, float dloss,
                                float loss_scale, ops::Stream s) {
  PipelineStages st;
  const size_t n = (size_t)mb.B * mb.T;
  st.compute = [&m, &store, mb, dloss, loss_scale, s, n](const PipeAction& a, int slot,
                                                         const PipeAction* next) {
    const GPTLayout& g = m.layout;
    StageCall c;
    c.chunk = a.chunk, c.slot = slot, c.B = mb.B, c.T = mb.T;
    c.dloss = dloss, c.loss_scale_for_log = loss_scale, c.with_loss = mb.targets != nullptr;
    c.last_micro_step = a.micro == mb.m - 1;
    c.next_unit = next ? g.entry_unit(next->chunk, next->op == PipeOp::Forward) : -1;
    if (a.op == PipeOp::Backward) return gpt_stage_backward(m, store, c, s);
    const int* tokens = g.first_stage(a.chunk) ? mb.tokens + a.micro * n : nullptr;
    const int* targets =
        g.last_stage(a.chunk) && mb.targets ? mb.targets + a.micro * n : nullptr;
    gpt_upload(m, slot, tokens, targets, mb.B, mb.T, s);
    gpt_stage_forward(m, store, c, s);
  };
  st.boundary = [&m](PipeOp op, int slot) -> void* {
    if (op == PipeOp::SendForward) return gpt_stage_output(m, slot);
    if (op == PipeOp::RecvForward) return m.slots[slot].input;
    return m.slots[slot].grad;
  };
  st.boundary_count = (size_t)m.layout.tp.tokens((int)n) * m.layout.C;
  st.dt = m.dt;
  return st;
}

void gpt_train_step(GPT& m, ParamStore& store, Pipeline& pl, const MicroBatches& mb,
                    float dloss, float loss_scale_for_log, ops::Stream s) {
  CHECK(mb.m == pl.schedule.m, "pipeline built for %d micro-batches, given %d", pl.schedule.m,
        mb.m);
  grads_zero(store);
  ops::fill_zero(m.loss_sum, sizeof(float), s);
  gpt_step_begin(m, store, true);
  pipeline_run(pl, stages_of(m, store, mb, dloss, loss_scale_for_log, s), s);
  gpt_step_end(m, store, true);
  grads_wait(store);
}

void gpt_pipeline_forward(GPT& m, ParamStore& store, const Pipeline& pl, const MicroBatches& mb,
                          ops::Stream s) {
  gpt_step_begin(m, store, false);
  pipeline_forward(pl, stages_of(m, store, mb, 0.0f, 0.0f, s), s);
  gpt_step_end(m, store, false);
}
