// model/gpt_head.cu - the head of the GPT (model/gpt.h): the final norm, the logits over the
// vocabulary, the cross-entropy loss and, when training, their backward, which leaves the
// gradient of the last block's output in the slot. It runs on the last pipeline stage only,
// right after that stage's blocks: forward, loss and backward in one go, so the last stage keeps
// one set of head buffers, whatever the number of micro-batches in flight.
//
//   lnf = norm(x_L)       logits = lnf W^T (W: the output weight, Vp x C)
//   loss = cross-entropy over the first V columns, vocabulary-parallel under tp
//
// Over token chunks. The logits are the largest activation (Vp/tp columns per token against C),
// and each token's logits are needed only for its own loss and its own gradient rows, so the head
// runs chunk by chunk (head_chunk tokens, a quarter of the micro-batch): the chunk's logits, its
// losses and in place the logits' gradient, then its share of the output weight's gradient
// (dW += dlogits^T lnf, summed over chunks in fp32: the only difference from one big GEMM is
// that order) and its rows of d(lnf), partial over tp until one sum after the last chunk. So no
// (N, Vp) buffer exists: the chunk's logits live in the backward's scratch, which no block
// backward uses while the head runs. Under SP the final norm's output is gathered once, before
// the chunks (the column-parallel linear taken apart, parallel/tensor_parallel.h). Sampling
// names the row it wants before the forward (model.logits_row); the head copies that row's
// logits aside as its chunk passes.
//
// The output weight comes in as a pointer (with its gradient): GPT-2 ties it to wte; an untied
// Llama passes lm_head (its head unit's, model/gpt_layout.cu). The final norm is called through
// one pair of functions (final_norm_forward/backward): LayerNorm, or Llama's RMSNorm.
#include "model/gpt_parts.h"

#include <algorithm>

#include "parallel/param_store.h"

template <typename Ptr>
static Ptr new_buffer(GPT& m, size_t bytes) {
  return (Ptr)gpt_new_buffer(m, bytes);
}

bool gpt_runs_head(const GPTLayout& g) {
  for (int c = 0; c < g.pp.v; c++)
    if (g.last_stage(c)) return true;
  return false;
}

// A quarter of the tokens, rounded down to a multiple of 8 when that is at least 8: every chunk
// then starts at a row offset that is a multiple of 16 bytes, as vector loads want.
int head_chunk_tokens(int N, int asked) {
  if (asked > 0) return std::min(asked, N);
  const int quarter = N / 4;
  return quarter >= 8 ? quarter / 8 * 8 : std::max(1, quarter);
}

void head_create(GPT& m) {
  const GPTLayout& g = m.layout;
  const TensorParallel& tp = g.tp;
  const size_t N = (size_t)m.B * m.T, Nt = tp.tokens((int)N), C = g.C, a = dtype_size(m.dt);
  m.head_chunk = head_chunk_tokens((int)N, m.head_chunk);
  if (!gpt_runs_head(g)) return;
  const size_t chunk = m.head_chunk;
  m.lnf = new_buffer<void*>(m, Nt * C * a);
  m.lnf_mean = g.llama ? nullptr : new_buffer<float*>(m, Nt * 4);  // RMSNorm: no mean
  m.lnf_rstd = new_buffer<float*>(m, Nt * 4);
  m.losses = new_buffer<float*>(m, N * 4);
  m.targets = new_buffer<int*>(m, N * 4);
  m.row_logits = new_buffer<void*>(m, g.Vp_local * a);
  if (tp.active()) {
    m.vocab_row = new_buffer<void*>(m, g.Vp * a);
    m.ce_stats = new_buffer<float*>(m, chunk * 3 * 4);
    m.ce_parts = new_buffer<float*>(m, tp.size() * chunk * 3 * 4);
  }
}

size_t head_scratch_bytes(const GPT& m) {
  if (!gpt_runs_head(m.layout)) return 0;
  return (size_t)m.head_chunk * m.layout.Vp_local * dtype_size(m.dt);
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

// Tokens [n0, n0 + n) of the head: their logits (this rank's Vp_local vocabulary columns) from
// `in`, every token's final-norm output; their losses (and with dloss != 0 the logits' gradient
// in place); when training, the output weight's gradient and the input gradient's partial sum
// (rows n0.. of buf.dinp_all, summed over tp after the last chunk).
struct HeadChunk {
  const void* in;       // (N,C) every token's lnf
  const void* head_w;   // (Vp_local,C)
  float* head_grad;     // (Vp_local,C) fp32, or null: no backward
  int n0, n;
};
static void head_chunk(GPT& m, const HeadChunk& h, const StageCall& c, ops::Stream s) {
  const GPTLayout& g = m.layout;
  const size_t a = dtype_size(m.dt), row = (size_t)h.n0 * g.C * a;
  const void* in = (const char*)h.in + row;
  ops::matmul_forward(m.logits, nullptr, in, h.head_w, nullptr, nullptr, h.n, g.C, g.Vp_local,
                      m.dt, s);
  if (m.logits_row >= h.n0 && m.logits_row < h.n0 + h.n)  // sampling
    ops::copy_on_device(m.row_logits,
                        (const char*)m.logits + (size_t)(m.logits_row - h.n0) * g.Vp_local * a,
                        g.Vp_local * a, s);
  if (c.with_loss)
    tp_cross_entropy(g.tp, m.logits, m.losses + h.n0, m.ce_stats, m.ce_parts,
                     m.targets + h.n0, c.dloss, h.n, g.V, g.Vp_local, g.vocab_first, m.dt, s);
  if (!h.head_grad) return;
  void* dinp = (char*)tp_buffers(m).dinp_all + row;
  ops::matmul_backward(dinp, h.head_grad, nullptr, m.logits, in, h.head_w, nullptr, h.n, g.C,
                       g.Vp_local, m.dt, s);
}

void gpt_head(GPT& m, ActivationSlot& sl, const void* x, const StageCall& c, ops::Stream s) {
  const GPTLayout& g = m.layout;
  const int N = c.B * c.T, Nt = g.tp.tokens(N);
  const bool training = c.dloss != 0;
  const TpBuffers buf = tp_buffers(m);
  const int head = g.tied ? kWte : kLmHead;  // the output layer's weight
  final_norm_forward(m, x, Nt, s);
  HeadChunk h;
  h.in = column_parallel_gather(g.tp, buf, m.lnf, N, g.C, m.dt, s);  // f forward
  h.head_w = root_weight(m, head);
  h.head_grad = training ? root_grad(m, head) : nullptr;
  for (h.n0 = 0; h.n0 < N; h.n0 += m.head_chunk) {
    h.n = std::min(m.head_chunk, N - h.n0);
    head_chunk(m, h, c, s);
  }
  if (c.loss_scale_for_log != 0)
    ops::sum_accumulate(m.loss_sum, m.losses, N, c.loss_scale_for_log, s);
  if (!training) return;
  const void* dlnf = column_parallel_sum_input_grad(g.tp, buf, N, g.C, m.dt, s);  // f backward
  final_norm_backward(m, sl.grad, dlnf, x, Nt, s);
}

std::vector<float> gpt_logits_row(GPT& m, ops::Stream s) {
  const GPTLayout& g = m.layout;
  const size_t e = dtype_size(m.dt);
  const void* src = tp_vocabulary_row(g.tp, m.vocab_row, m.row_logits, g.Vp_local, m.dt, s);
  std::vector<unsigned char> raw(g.Vp * e);
  ops::stream_sync(s);
  ops::copy_to_host(raw.data(), src, g.Vp * e);
  std::vector<float> row(g.V);
  for (int j = 0; j < g.V; j++) row[j] = element_as_float(raw.data(), j, m.dt);
  return row;
}
