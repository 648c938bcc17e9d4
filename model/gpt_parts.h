// model/gpt_parts.h - the pieces the GPT's files share: model/gpt.cu (activations, the forward,
// the stages) defines most of them, model/gpt_backward.cu (the backward, whole or split into
// its input-gradient and weight-gradient passes) and model/gpt_head.cu (the head) use them.
// Nothing outside model/gpt*.cu includes this; the interface is model/gpt.h.
#pragma once
#include "model/gpt.h"
#include "model/moe.h"

// Block l's tensors, by BlockTensor index: their weights and their offsets in the unit (where
// their gradients are in the unit's gradient buffer). An index the block lacks stays null, and
// so do the weights when they were not acquired (a weight pass needs none).
struct BlockWeights {
  void* w[kBlockTensors] = {};
  size_t offset[kBlockTensors] = {};
  bool has[kBlockTensors] = {};             // the block has this tensor (Llama: no biases)
  float* grads = nullptr;                   // the unit's fp32 gradient buffer (backward)
  ExpertWeights experts{}, expert_grads{};  // an MoE block's (from its expert unit)
};
// Block l from the store: its unit and, for an MoE block, its experts' unit, acquired and
// released together (ParamUnit::paired); with `weights` their weights, with `grads` their
// gradient buffers.
BlockWeights acquire_block(GPT& m, ParamStore& store, int l, bool weights, bool grads);
void release_block(GPT& m, ParamStore& store, int l, bool weights, bool grads,
                   bool last_micro_step);
// A root tensor's weights and its gradient, between gpt_step_begin and gpt_step_end.
void* root_weight(const GPT& m, int i);
float* root_grad(const GPT& m, int i);
// The block's and the head's normalisation, forward and backward: LayerNorm's (GPT-2) or
// RMSNorm's (Llama, which has no mean and no bias: those are ignored).
void norm_forward(const GPT& m, void* out, float* mean, float* rstd, const void* inp,
                  const void* weight, const void* bias, int N, ops::Stream s);
void norm_backward(const GPT& m, void* dinp, float* dweight, float* dbias, const void* dout,
                   const void* inp, const void* weight, const float* mean, const float* rstd,
                   int N, ops::Stream s);
// Llama's rotary embedding on a packed qkv of B sequences of T local positions (backward: on its
// gradient, the rotation's transpose), at this rank's global positions, or with doc_positions
// (the slot's, [data] document_positions) at each token's position inside its document.
void rope_apply(const GPT& m, void* qkv, int B, int T, bool backward, ops::Stream s,
                const int* doc_positions = nullptr);
// The GEMM of linear layer `site` (BlockLinear numbering): compute dtype, or FP8 (model/fp8.h).
LinearGemm block_gemm(const GPT& m, int site);
// The model's scratch that the tensor-parallel layers work in (null where tp or SP is off).
TpBuffers tp_buffers(const GPT& m);
// The input of the chunk's j-th block.
const void* block_input(const ActivationSlot& sl, int j);
// Block l, the j-th of its chunk, forward on the micro-batch in slot sl (write_output false: a
// recompute for its backward, all but the output).
void block_forward(GPT& m, ActivationSlot& sl, int j, int l, const BlockWeights& bw, int B,
                   int T, bool write_output, float dloss, ops::Stream s);
// While block j of the chunk computes, starts fetching the units the next [parallel]
// fsdp_prefetch acquisitions need: blocks j + step, j + 2 step, ... of the chunk (step +1 in the
// forward, -1 in the backward), then the schedule's next action's first unit (c.next_unit).
void prefetch_ahead(GPT& m, ParamStore& store, const StageCall& c, int j, int step);
// Where this rank's tokens of the micro-batch sit in their sequences (zigzag under cp), or inside
// their documents ([data] document_positions: the slot's doc_positions).
TokenPositions token_positions(const GPT& m, const StageCall& c);

// The head (model/gpt_head.cu): its buffers but the logits (in gpt_create, which sets
// model.head_chunk), the bytes of its logits (in the backward's scratch), and on the last stage after its
// blocks the final norm, logits and loss of the micro-batch whose last block output is x and,
// when training (c.dloss != 0), their backward, leaving d(x) in sl.grad.
void head_create(GPT& m);
size_t head_scratch_bytes(const GPT& m);
void gpt_head(GPT& m, ActivationSlot& sl, const void* x, const StageCall& c, ops::Stream s);
