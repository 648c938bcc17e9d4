// model/gpt_pipeline.cu - the GPT's stages as the pipeline executor sees them
// (model/gpt_pipeline.h): a compute action becomes gpt_stage_forward, gpt_stage_backward (the
// whole backward, or its input-gradient pass B when the schedule splits) or gpt_stage_weight
// (the weight pass W) on a slot, and boundary messages land in the slot's input and gradient
// buffers. Where the neighbouring stage is on this rank too (rank p-1 of the V order), the
// activation and the gradient go from slot to slot by a copy instead of a message.
#include "model/gpt_pipeline.h"

bool gpt_holds_output(const GPT& m) {
  const GPTLayout& g = m.layout;
  return g.last_stage(g.pp.v - 1);
}

// The previous stage is on this rank (call.local_slot): a forward takes its output as input,
// before; a backward hands it its input gradient, after.
static void local_input(GPT& m, const ComputeCall& call, size_t elems, ops::Stream s) {
  const GPTLayout& g = m.layout;
  const int prev = pipeline_stage_chunk(g.pp.order, g.pp.p(), g.stage(call.action.chunk) - 1);
  ops::copy_on_device(m.slots[call.slot].input, gpt_stage_output(m, call.local_slot, prev),
                      elems * dtype_size(m.dt), s);
}
static void local_gradient(GPT& m, const ComputeCall& call, size_t elems, ops::Stream s) {
  ops::copy_on_device(m.grads[call.local_grad], m.slots[call.slot].grad,
                      elems * dtype_size(m.dt), s);
}

static PipelineStages stages_of(GPT& m, ParamStore& store, const MicroBatches& mb, float dloss,
                                float loss_scale, ops::Stream s) {
  PipelineStages st;
  const size_t n = (size_t)mb.B * mb.T;
  st.boundary_count = (size_t)m.layout.tp.tokens((int)n) * m.layout.C;
  const size_t elems = st.boundary_count;
  st.compute = [&m, &store, mb, dloss, loss_scale, s, n, elems](const ComputeCall& call) {
    const GPTLayout& g = m.layout;
    const PipeAction& a = call.action;
    if (call.grad >= 0) m.slots[call.slot].grad = m.grads[call.grad];  // lent for this action
    StageCall c;
    c.chunk = a.chunk, c.slot = call.slot, c.B = mb.B, c.T = mb.T;
    c.dloss = dloss, c.loss_scale_for_log = loss_scale, c.with_loss = mb.targets != nullptr;
    // The chunk's gradients are complete after its last backward (last weight pass when split).
    c.last_micro_step = call.last_of_chunk && (a.op == PipeOp::Weight || !call.split);
    c.next_unit = call.next ? g.entry_unit(call.next->chunk, call.next->op == PipeOp::Forward)
                            : -1;
    c.part = call.split ? GradPart::Input : GradPart::Both;
    if (a.op == PipeOp::Weight) return gpt_stage_weight(m, store, c, s);
    if (a.op == PipeOp::Backward) {
      gpt_stage_backward(m, store, c, s);
      if (call.local_slot >= 0) local_gradient(m, call, elems, s);
      return;
    }
    const int* tokens = g.first_stage(a.chunk) ? mb.tokens + a.micro * n : nullptr;
    const int* targets =
        g.last_stage(a.chunk) && mb.targets ? mb.targets + a.micro * n : nullptr;
    const size_t full = n * g.cp->size;  // a micro-batch's document ids cover the full rows
    gpt_upload(m, call.slot, tokens, targets, mb.B, mb.T, s,
               mb.docs ? mb.docs + a.micro * full : nullptr,
               mb.doc_positions ? mb.doc_positions + a.micro * n : nullptr, mb.on_device);
    if (call.local_slot >= 0) local_input(m, call, elems, s);
    gpt_stage_forward(m, store, c, s);
  };
  st.boundary = [&m](const PipeAction& a, int at) -> void* {
    if (a.op == PipeOp::SendForward) return gpt_stage_output(m, at, a.chunk);
    if (a.op == PipeOp::RecvForward) return m.slots[at].input;
    return m.grads[at];  // a gradient buffer
  };
  st.dt = m.dt;
  return st;
}

void gpt_train_step(GPT& m, ParamStore& store, Pipeline& pl, const MicroBatches& mb,
                    float dloss, float loss_scale_for_log, ops::Stream s) {
  CHECK(mb.m == pl.schedule.m, "pipeline built for %d micro-batches, given %d", pl.schedule.m,
        mb.m);
  CHECK(m.split_backward == pl.schedule.split, "the model was made for %s backwards, the "
        "schedule runs %s ones", m.split_backward ? "split" : "whole",
        pl.schedule.split ? "split" : "whole");
  CHECK((size_t)pl.grads <= m.grads.size(), "the pipeline lends %d gradient buffers, the model "
        "has %zu", pl.grads, m.grads.size());
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
