// model/gpt_backward.cu - GPT-2's backward (model/gpt.h): a chunk's blocks in reverse, whole, or
// split in two for the zero-bubble pipeline schedules (parallel/pipeline_schedule.h).
//
// The block's backward walks its forward in reverse with one residual-gradient buffer (the
// slot's `grad`) that each LayerNorm backward accumulates into: d r3 -> d r2 -> d x. Each linear
// layer's backward is two GEMMs: the input gradient dX = dY W, which the previous layer waits
// for, and the weight gradient dW += dY^T X, which nobody waits for but the optimizer.
//
// The split. A schedule that splits backwards runs, per (micro-batch, chunk):
//   B (gpt_stage_backward, GradPart::Input): every input gradient, the attention and the
//     LayerNorms' backward, the MoE layer's token movement and its input gradients; the
//     LayerNorms' weight gradients go to a small scratch (m.ln_grads, 4C floats per layer) so
//     that B never touches the store's gradient buffers.
//   W (gpt_stage_weight, later): the weight and bias gradients of every linear (and of the MoE
//     experts and router), the scratch added into the unit's gradient, and on the first stage the
//     embedding's backward. It needs no weights; it acquires only the gradient buffers, so the
//     store reduces a unit's gradient (DDP bucket, FSDP reduce-scatter) after its last W.
// W needs, per linear, its input and its output gradient. The inputs are activations the slot
// keeps anyway (ln1, atty, ln2, gelu(fch); the experts' x and gelu(h)); the output gradients
// are kept by B in activation buffers B itself is done with, of the same shape, so the split
// costs no memory but the scratch:
//
//   d(r3)  (tokens mine, C)   -> r3   (the block's output: read by the next block's B already)
//   d(fch) (N, 4C/tp)         -> fch  (read by GELU' in this B; Llama's (N, 2F/tp) by SwiGLU's
//                                      backward)
//   d(r2)  (tokens mine, C)   -> r2   (read by LN2's backward in this B)
//   d(qkv) (N, 3C/tp)         -> qkv  (read by the attention backward in this B)
//   MoE: d(expert output) rows -> dy (one more buffer per MoE layer and slot), d(h) -> h,
//        d(router logits) fp32 -> logits
//
// The slot is then held until W (parallel/pipeline.cu), and recompute is refused with these
// schedules: it shares the activations W reads between layers. Under sequence parallelism a
// row-parallel linear's W gathers dY again (one more all-gather per row-parallel linear), and a
// column-parallel one's W gathers its input, which the unsplit backward does too.
#include <algorithm>

#include "model/fp8.h"
#include "model/gpt_parts.h"
#include "parallel/context_parallel.h"
#include "parallel/param_store.h"

// An activation buffer B is done with receives the tensor W will need.
static void keep(void* dst, const void* src, size_t elems, DType dt, ops::Stream s) {
  ops::copy_on_device(dst, src, elems * dtype_size(dt), s);
}

// The dense MLP's backward: d(r3) = dres -> d(ln2), which it returns (this rank's tokens).
static const void* mlp_backward(GPT& m, LayerActs& a, int l, const BlockWeights& bw,
                                const void* dres, float* g, int N, GradPart part,
                                ops::Stream s) {
  const GPTLayout& lay = m.layout;
  const TensorParallel& tp = lay.tp;
  const TpBuffers buf = tp_buffers(m);
  const int C = lay.C, F = lay.mlp_local(l), FC = lay.mlp_fc_local(l), site = kBlockLinears * l;
  auto grad = [&](int i) { return g && bw.has[i] ? g + bw.offset[i] : nullptr; };
  void* const* w = bw.w;
  if (lay.llama) {  // r3 = r2 + swiglu(fch) Wp^T: d swiglu = dres @ Wp, then d fch = [d gate | d up]
    row_parallel_backward(tp, block_gemm(m, site + kFcProjLinear), buf, m.dswiglu,
                          grad(kFcProjW), nullptr, dres, a.fch_gelu, w[kFcProjW], nullptr, N, F,
                          C, s, part);
    ops::swiglu_backward(m.dfch, m.dswiglu, a.fch, N, F, m.dt, s);
  } else {  // r3 = r2 + fcproj(gelu(fch)): d fch = (dres @ Wp) * gelu'(fch), fused in the GEMM
    row_parallel_backward(tp, block_gemm(m, site + kFcProjLinear), buf, m.dfch, grad(kFcProjW),
                          grad(kFcProjB), dres, a.fch_gelu, w[kFcProjW], a.fch, N, F, C, s,
                          part);
  }
  if (part == GradPart::Input) keep(a.fch, m.dfch, (size_t)N * FC, m.dt, s);
  return column_parallel_backward(tp, block_gemm(m, site + kFcLinear), buf, grad(kFcW),
                                  grad(kFcB), m.dfch, a.ln2, false, w[kFcW], N, C, FC, s, part);
}

// Block l's backward, the j-th of its chunk. On entry sl.grad holds d(r3); on exit d(x). Part
// Both: the weight gradients accumulate into bw.grads (the unit's fp32 gradient buffer). Part
// Input (B): none, the LayerNorms' into m.ln_grads, and d(r3), d(fch), d(r2), d(qkv) are kept
// for the weight pass (top of the file). The parallel linears' backwards move what crosses the
// tp group (parallel/tensor_parallel.cu).
static void block_backward(GPT& m, ActivationSlot& sl, int j, int l, const BlockWeights& bw,
                           int B, int T, float dloss, GradPart part, ops::Stream s) {
  float* g = bw.grads;
  const GPTLayout& lay = m.layout;
  const TensorParallel& tp = lay.tp;
  const TpBuffers buf = tp_buffers(m);
  const int C = lay.C, Cl = C / tp.size(), N = B * T, Nt = tp.tokens(N), site = kBlockLinears * l;
  const bool split = part == GradPart::Input;
  auto gemm = [&](int linear) { return block_gemm(m, site + linear); };
  auto grad = [&](int i) { return g && bw.has[i] ? g + bw.offset[i] : nullptr; };
  // The LayerNorms' weight gradients: the unit's, or the scratch (ln1 w, b, ln2 w, b).
  auto ln_grad = [&](int i) {
    return split ? m.ln_grads + ((size_t)l * 4 + (i - kLn1W)) * C : grad(i);
  };
  const void* x = block_input(sl, j);
  LayerActs& a = sl.layers[j];
  void* const* w = bw.w;
  void* dres = sl.grad;
  if (split) keep(a.r3, dres, (size_t)Nt * C, m.dt, s);
  const void* dln2 = m.dln;  // an MoE block's MLP (model/moe.cu) leaves d(ln2) there
  if (lay.moe[l]) {
    void* shared = m.moe->shared_sum;  // the shared experts' d(ln2), while the router's is made
    if (lay.Fs_local > 0)
      ops::copy_on_device(shared, mlp_backward(m, a, l, bw, dres, g, N, part, s),
                          (size_t)Nt * C * dtype_size(m.dt), s);
    moe_backward(m, *a.moe, m.dln, dres, a.ln2, w[kRouterW], grad(kRouterW), bw.experts,
                 bw.expert_grads, B, T, dloss, part, s);
    if (lay.Fs_local > 0) ops::add_bias_residual(m.dln, m.dln, nullptr, shared, Nt, C, m.dt, s);
  } else {
    dln2 = mlp_backward(m, a, l, bw, dres, g, N, part, s);
  }
  norm_backward(m, dres, ln_grad(kLn2W), ln_grad(kLn2B), dln2, a.r2, w[kLn2W], a.ln2_mean,
                a.ln2_rstd, Nt, s);  // dres is now d(r2)
  if (split) keep(a.r2, dres, (size_t)Nt * C, m.dt, s);
  row_parallel_backward(tp, gemm(kAttnProjLinear), buf, m.datty, grad(kAttnProjW),
                        grad(kAttnProjB), dres, a.atty, w[kAttnProjW], nullptr, N, Cl, C, s, part);
  cp_attention_backward(*m.cp, m.dqkv, m.datty, a.qkv, a.atty, a.lse, B, T, s, sl.docs);
  if (lay.llama)  // d(qkv before its rotation)
    rope_apply(m, m.dqkv, B, T, true, s, sl.doc_positions);
  if (split) keep(a.qkv, m.dqkv, (size_t)N * lay.qkv_local(), m.dt, s);
  const void* dln1 = column_parallel_backward(tp, gemm(kQkvLinear), buf, grad(kQkvW), grad(kQkvB),
                                              m.dqkv, a.ln1, false, w[kQkvW], N, C,
                                              lay.qkv_local(), s, part);
  norm_backward(m, dres, ln_grad(kLn1W), ln_grad(kLn1B), dln1, x, w[kLn1W], a.ln1_mean,
                a.ln1_rstd, Nt, s);  // dres is now d(x)
}

// Block l's weight pass (W): every linear's weight and bias gradient from the input and the
// output gradient B kept, and the LayerNorms' from the scratch, into bw.grads.
static void block_weight_pass(GPT& m, ActivationSlot& sl, int j, int l, const BlockWeights& bw,
                              int B, int T, ops::Stream s) {
  const GPTLayout& lay = m.layout;
  const TensorParallel& tp = lay.tp;
  const TpBuffers buf = tp_buffers(m);
  const int C = lay.C, Cl = C / tp.size(), N = B * T, site = kBlockLinears * l;
  const GradPart W = GradPart::Weight;
  auto gemm = [&](int linear) { return block_gemm(m, site + linear); };
  auto grad = [&](int i) { return bw.has[i] ? bw.grads + bw.offset[i] : nullptr; };
  const LayerActs& a = sl.layers[j];
  if (lay.moe[l]) moe_weight_pass(m, *a.moe, a.ln2, grad(kRouterW), bw.expert_grads, B, T, s);
  if (lay.has_mlp(l)) {  // the dense MLP, or the shared experts
    row_parallel_backward(tp, gemm(kFcProjLinear), buf, nullptr, grad(kFcProjW), grad(kFcProjB),
                          a.r3, a.fch_gelu, nullptr, nullptr, N, lay.mlp_local(l), C, s, W);
    column_parallel_backward(tp, gemm(kFcLinear), buf, grad(kFcW), grad(kFcB), a.fch, a.ln2,
                             false, nullptr, N, C, lay.mlp_fc_local(l), s, W);
  }
  row_parallel_backward(tp, gemm(kAttnProjLinear), buf, nullptr, grad(kAttnProjW),
                        grad(kAttnProjB), a.r2, a.atty, nullptr, nullptr, N, Cl, C, s, W);
  column_parallel_backward(tp, gemm(kQkvLinear), buf, grad(kQkvW), grad(kQkvB), a.qkv, a.ln1,
                           false, nullptr, N, C, lay.qkv_local(), s, W);
  float* ln = m.ln_grads + (size_t)l * 4 * C;
  for (int i = kLn1W; i <= kLn2B; i++)  // (a Llama's RMSNorms have no bias)
    if (bw.has[i]) ops::add_inplace(grad(i), ln + (i - kLn1W) * C, C, s);
  ops::fill_zero(ln, (size_t)4 * C * sizeof(float), s);
}

// The first stage's embedding backward: the tied wte's second gradient contribution and wpe's,
// from d(input) in the slot.
static void embedding_backward(GPT& m, const StageCall& c, ops::Stream s) {
  const GPTLayout& g = m.layout;
  const ActivationSlot& sl = m.slots[c.slot];
  tp_embedding_backward(g.tp, root_grad(m, kWte), root_grad(m, kWpe), m.gathered, sl.grad,
                        sl.tokens, token_positions(m, c), g.C, g.vocab_first, g.Vp_local, g.V,
                        m.dt, s);
}

// recompute = "gelu": the MLP's activation output again, from the kept fc output (GPT-2's
// gelu(fch), Llama's silu(gate) * up).
static void recompute_gelu(GPT& m, LayerActs& a, int l, int N, ops::Stream s) {
  const GPTLayout& g = m.layout;
  if (g.llama)
    ops::swiglu_forward(a.fch_gelu, a.fch, N, g.mlp_local(l), m.dt, s);
  else
    ops::gelu_forward(a.fch_gelu, a.fch, (size_t)N * g.mlp_local(l), m.dt, s);
}

void gpt_stage_backward(GPT& m, ParamStore& store, const StageCall& c, ops::Stream s) {
  const GPTLayout& g = m.layout;
  ActivationSlot& sl = m.slots[c.slot];
  const int first = g.first_block(c.chunk), n = g.blocks(c.chunk), N = c.B * c.T;
  const bool whole = c.part == GradPart::Both;
  ops::range_push("backward");
  for (int j = n - 1; j >= 0; j--) {
    const int l = first + j;
    const BlockWeights bw = acquire_block(m, store, l, true, whole);
    prefetch_ahead(m, store, c, j, -1);
    if (m.recompute == Recompute::Block)
      block_forward(m, sl, j, l, bw, c.B, c.T, false, c.dloss, s);
    if (m.recompute == Recompute::Gelu && g.has_mlp(l)) recompute_gelu(m, sl.layers[j], l, N, s);
    block_backward(m, sl, j, l, bw, c.B, c.T, c.dloss, c.part, s);
    release_block(m, store, l, true, whole, c.last_micro_step);
  }
  if (whole && g.first_stage(c.chunk)) embedding_backward(m, c, s);
  if (whole) grads_micro_batch_done(store);
  ops::range_pop();
}

void gpt_stage_weight(GPT& m, ParamStore& store, const StageCall& c, ops::Stream s) {
  const GPTLayout& g = m.layout;
  const int first = g.first_block(c.chunk), n = g.blocks(c.chunk);
  ops::range_push("weight");
  if (c.next_unit >= 0) params_prefetch(store, c.next_unit);  // no weights needed here
  for (int j = n - 1; j >= 0; j--) {
    const int l = first + j;
    const BlockWeights bw = acquire_block(m, store, l, false, true);
    block_weight_pass(m, m.slots[c.slot], j, l, bw, c.B, c.T, s);
    release_block(m, store, l, false, true, c.last_micro_step);
  }
  if (g.first_stage(c.chunk)) embedding_backward(m, c, s);
  grads_micro_batch_done(store);  // W completes the micro-batch's gradients
  ops::range_pop();
}
