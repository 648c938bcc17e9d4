// model/gpt_head.cu - the head of the GPT (model/gpt.h): the final norm, the logits over the
// vocabulary, the cross-entropy loss and, when training, their backward, which leaves the
// gradient of the last block's output in the slot. It runs on the last pipeline stage only,
// right after that stage's blocks: forward, loss and backward in one go, so the last stage keeps
// one set of head buffers, whatever the number of micro-batches in flight.
//
//   lnf = norm(x_L)       logits = lnf W^T (W: the output weight, Vp x C)
//   loss = cross-entropy over the first V columns, vocabulary-parallel under tp
//
// The output weight comes in as a pointer (with its gradient): GPT-2 ties it to wte; an untied
// Llama passes lm_head (its head unit's, model/gpt_layout.cu). The final norm is called through
// one pair of functions (final_norm_forward/backward): LayerNorm, or Llama's RMSNorm.
#include "model/gpt_parts.h"

#include "parallel/param_store.h"

template <typename Ptr>
static Ptr new_buffer(GPT& m, size_t bytes) {
  return (Ptr)gpt_new_buffer(m, bytes);
}

void head_create(GPT& m) {
  const GPTLayout& g = m.layout;
  const TensorParallel& tp = g.tp;
  const size_t N = (size_t)m.B * m.T, Nt = tp.tokens((int)N), C = g.C, a = dtype_size(m.dt);
  if (g.head_unit >= 0) {  // the head's buffers (last stage; and the first when tied)
    m.lnf = new_buffer<void*>(m, Nt * C * a);
    m.lnf_mean = g.llama ? nullptr : new_buffer<float*>(m, Nt * 4);  // RMSNorm: no mean
    m.lnf_rstd = new_buffer<float*>(m, Nt * 4);
    m.logits = new_buffer<void*>(m, N * g.Vp_local * a);
    m.losses = new_buffer<float*>(m, N * 4);
    m.targets = new_buffer<int*>(m, N * 4);
  }
  if (tp.active()) {
    m.vocab_row = new_buffer<void*>(m, g.Vp * a);
    m.ce_stats = new_buffer<float*>(m, N * 3 * 4);
    m.ce_parts = new_buffer<float*>(m, tp.size() * N * 3 * 4);
  }
}

// The final norm over this rank's tokens (Nt of the N), and its backward, which writes d(x).
static void final_norm_forward(GPT& m, const void* x, int Nt, ops::Stream s) {
  norm_forward(m, m.lnf, m.lnf_mean, m.lnf_rstd, x, root_weight(m, kLnfW), root_weight(m, kLnfB),
               Nt, s);
}
static void final_norm_backward(GPT& m, void* dx, const void* dlnf, const void* x, int Nt,
                                ops::Stream s) {
  ops::fill_zero(dx, (size_t)Nt * m.layout.C * dtype_size(m.dt), s);
  norm_backward(m, dx, root_grad(m, kLnfW), root_grad(m, kLnfB), dlnf, x, root_weight(m, kLnfW),
                m.lnf_mean, m.lnf_rstd, Nt, s);
}

// Final norm and the logits (this rank's vocabulary columns) of the chunk's output: a
// column-parallel GEMM over the vocabulary, in the compute dtype. Its gathered input stays in the
// model's tp buffer for head_backward, which follows before any other gather.
static void head_forward(GPT& m, const void* x, const void* head_w, int N, ops::Stream s) {
  const GPTLayout& g = m.layout;
  final_norm_forward(m, x, g.tp.tokens(N), s);
  column_parallel_forward(g.tp, compute_dtype_gemm(m.dt), tp_buffers(m), m.logits, nullptr, m.lnf,
                          head_w, nullptr, N, g.C, g.Vp_local, s);
}

// The loss (and with dloss != 0 its gradient, over the logits), vocabulary-parallel under tp.
static void cross_entropy(GPT& m, float dloss, int N, ops::Stream s) {
  const GPTLayout& g = m.layout;
  tp_cross_entropy(g.tp, m.logits, m.losses, m.ce_stats, m.ce_parts, m.targets, dloss, N, g.V,
                   g.Vp_local, g.vocab_first, m.dt, s);
}

// The output layer's backward: logits = lnf @ W^T (lnf over all tokens), lnf = norm(x_L).
// Leaves d(x_L) in sl.grad; x is x_L.
static void head_backward(GPT& m, ActivationSlot& sl, const void* x, const void* head_w,
                          float* head_grad, int N, ops::Stream s) {
  const GPTLayout& g = m.layout;
  const void* dlnf =
      column_parallel_backward(g.tp, compute_dtype_gemm(m.dt), tp_buffers(m), head_grad, nullptr,
                               m.logits, m.lnf, true, head_w, N, g.C, g.Vp_local, s);
  final_norm_backward(m, sl.grad, dlnf, x, g.tp.tokens(N), s);
}

void gpt_head(GPT& m, ActivationSlot& sl, const void* x, const StageCall& c, ops::Stream s) {
  const int N = c.B * c.T;
  const int head = m.layout.tied ? kWte : kLmHead;  // the output layer's weight
  const void* head_w = root_weight(m, head);
  head_forward(m, x, head_w, N, s);
  if (c.with_loss) cross_entropy(m, c.dloss, N, s);
  if (c.loss_scale_for_log != 0)
    ops::sum_accumulate(m.loss_sum, m.losses, N, c.loss_scale_for_log, s);
  if (c.dloss != 0) head_backward(m, sl, x, head_w, root_grad(m, head), N, s);
}

std::vector<float> gpt_logits_row(GPT& m, int n, ops::Stream s) {
  const GPTLayout& g = m.layout;
  const size_t e = dtype_size(m.dt);
  const void* src = tp_vocabulary_row(g.tp, m.vocab_row,
                                      (const char*)m.logits + (size_t)n * g.Vp_local * e,
                                      g.Vp_local, m.dt, s);
  std::vector<unsigned char> raw(g.Vp * e);
  ops::stream_sync(s);
  ops::copy_to_host(raw.data(), src, g.Vp * e);
  std::vector<float> row(g.V);
  for (int j = 0; j < g.V; j++) row[j] = element_as_float(raw.data(), j, m.dt);
  return row;
}
