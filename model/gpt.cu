// model/gpt.cu - GPT-2 forward and backward over the backend seam (kernels/ops.h).
//
// One block, pre-LayerNorm, with the residual adds fused into the GEMM epilogues:
//
//   ln1 = LN(x)                    qkv = ln1 Wqkv^T + b          atty = causal_attention(qkv)
//   r2  = x + (atty Wo^T + b)      ln2 = LN(r2)                  fch  = ln2 Wfc^T + b
//   r3  = r2 + (gelu(fch) Wp^T + b)                              r3 is the next block's x
//
// and on top: lnf = LN(x_L), logits = lnf wte^T (tied), loss = cross-entropy over the first V
// columns. The backward walks the same graph in reverse with one residual-gradient buffer
// `dresidual` that each LayerNorm backward accumulates into (d r3 -> d r2 -> d x).
//
// Weights come from the ParamStore one unit at a time (acquire before use, release after), and
// each unit's gradients go back to it as soon as that unit's backward is done: that is all the
// model knows about DDP or FSDP.
//
// Recompute ([train] recompute): "gelu" keeps no per-layer gelu(fch) and recomputes it in the
// backward; "block" keeps only each block's input and reruns the whole block forward before its
// backward. Recomputed buffers point into one shared set of activations instead of per-layer ones.
//
// Tensor parallelism (layout.tp, parallel/tensor_parallel.cu) shows up here only as local shapes
// (this rank's heads, MLP columns and vocabulary rows) and as the calls that move activations
// across the group: tp_all_tokens before a column-parallel GEMM, the row-parallel sum after one,
// the vocabulary-parallel embedding and cross-entropy. With tp = 1 they do nothing. The four
// block GEMMs go through linear_forward / linear_backward, which run them in the compute dtype
// or, with [precision] compute = "fp8", on FP8 operands (model/fp8.h).
#include "model/gpt.h"

#include <cmath>

#include "model/fp8.h"
#include "parallel/param_store.h"

// ---------------------------------------------------------------------------------------------
// Layout
// ---------------------------------------------------------------------------------------------
// Initialisation and weight decay of a placed tensor.
static TensorPlacement init_normal(TensorPlacement t, float std, int64_t init_rows) {
  t.decay = t.cols > 1;
  t.init_std = std;
  t.init_rows = init_rows;
  return t;
}
static TensorPlacement init_const(TensorPlacement t, float value, bool partial_over_tp) {
  t.init_value = value;
  t.grad_partial_over_tp = partial_over_tp;
  return t;
}

GPTLayout gpt_layout(const ModelConfig& m, const TensorParallel& tp) {
  GPTLayout g;
  g.L = m.n_layer;
  g.NH = m.n_head;
  g.C = m.d_model;
  g.T = m.seq_len;
  g.maxT = m.max_seq_len > 0 ? m.max_seq_len : m.seq_len;
  g.V = m.vocab_size;
  g.Vp = m.padded_vocab();
  g.tp = tp;
  g.NH_local = g.NH / tp.size;
  g.Vp_local = g.Vp / tp.size;
  g.vocab_first = tp.rank * g.Vp_local;
  const int64_t C = g.C;
  const int r = tp.rank, t = tp.size;
  const bool sp = tp.sp && t > 1;  // LayerNorm gradients are partial sums over tp
  const float std = 0.02f, proj_std = 0.02f / std::sqrt(2.0f * g.L);

  ParamUnit root;  // order must match RootTensor
  add_tensor(root, init_normal(split_rows("wte", g.Vp, C, 1, r, t), std, g.V));  // pad rows: 0
  add_tensor(root, init_normal(replicated("wpe", g.maxT, C), std, g.maxT));
  add_tensor(root, init_const(replicated("ln_f/weight", C, 1), 1, sp));
  add_tensor(root, init_const(replicated("ln_f/bias", C, 1), 0, sp));
  finish_unit(root);
  g.units.push_back(root);

  for (int l = 0; l < g.L; l++) {
    ParamUnit u;  // order must match BlockTensor
    const std::string h = "h." + std::to_string(l) + "/";
    add_tensor(u, init_normal(split_rows(h + "attn/qkv/weight", 3 * C, C, 3, r, t), std, 3 * C));
    add_tensor(u, init_normal(split_cols(h + "attn/proj/weight", C, C, r, t), proj_std, C));
    add_tensor(u, init_normal(split_rows(h + "mlp/fc/weight", 4 * C, C, 1, r, t), std, 4 * C));
    add_tensor(u, init_normal(split_cols(h + "mlp/proj/weight", C, 4 * C, r, t), proj_std, C));
    add_tensor(u, init_const(split_rows(h + "attn/qkv/bias", 3 * C, 1, 3, r, t), 0, false));
    add_tensor(u, init_const(split_rows(h + "mlp/fc/bias", 4 * C, 1, 1, r, t), 0, false));
    // Row-parallel biases: added after the sum, and their gradient is summed over all N tokens
    // (the gathered dY), so it is complete on every rank even with SP.
    add_tensor(u, init_const(replicated(h + "attn/proj/bias", C, 1), 0, false));
    add_tensor(u, init_const(replicated(h + "mlp/proj/bias", C, 1), 0, false));
    add_tensor(u, init_const(replicated(h + "ln_1/weight", C, 1), 1, sp));
    add_tensor(u, init_const(replicated(h + "ln_1/bias", C, 1), 0, sp));
    add_tensor(u, init_const(replicated(h + "ln_2/weight", C, 1), 1, sp));
    add_tensor(u, init_const(replicated(h + "ln_2/bias", C, 1), 0, sp));
    finish_unit(u);
    g.units.push_back(u);
  }
  return g;
}

size_t GPTLayout::num_parameters() const {
  size_t n = 0;
  for (const ParamUnit& u : units)
    for (const TensorPlacement& t : u.tensors) n += t.numel();
  return n;
}

Recompute parse_recompute(const std::string& s) {
  if (s == "gelu") return Recompute::Gelu;
  if (s == "block") return Recompute::Block;
  return Recompute::None;
}

// ---------------------------------------------------------------------------------------------
// Activations
// ---------------------------------------------------------------------------------------------
template <typename Ptr>
static Ptr new_buffer(GPT& m, size_t bytes) {
  void* p = ops::alloc(bytes);
  ops::fill_zero(p, bytes, m.stream);
  m.owned.push_back(p);
  m.activation_bytes += bytes;
  return (Ptr)p;
}

// One full set of a layer's activations. `r3` is allocated separately (it is always kept).
// Nt = the tokens this rank holds in the residual stream, N = all tokens, Cl = C / tp.
static LayerActs new_layer_acts(GPT& m, bool with_gelu) {
  const GPTLayout& g = m.layout;
  const size_t N = (size_t)m.B * m.T, Nt = g.tp.tokens((int)N), C = g.C;
  const size_t Cl = C / g.tp.size, a = dtype_size(m.dt);
  LayerActs x{};
  x.ln1 = new_buffer<void*>(m, Nt * C * a);
  x.qkv = new_buffer<void*>(m, N * 3 * Cl * a);
  x.atty = new_buffer<void*>(m, N * Cl * a);
  x.r2 = new_buffer<void*>(m, Nt * C * a);
  x.ln2 = new_buffer<void*>(m, Nt * C * a);
  x.fch = new_buffer<void*>(m, N * 4 * Cl * a);
  x.fch_gelu = with_gelu ? new_buffer<void*>(m, N * 4 * Cl * a) : nullptr;
  x.ln1_mean = new_buffer<float*>(m, Nt * 4);
  x.ln1_rstd = new_buffer<float*>(m, Nt * 4);
  x.ln2_mean = new_buffer<float*>(m, Nt * 4);
  x.ln2_rstd = new_buffer<float*>(m, Nt * 4);
  x.lse = new_buffer<float*>(m, N * g.NH_local * 4);
  return x;
}

// The FP8 state of the 4 linear layers of every block (model/fp8.h).
static Fp8Context* new_fp8(const GPTLayout& g, const Fp8Recipe& recipe, int N, ops::Stream s) {
  std::vector<std::string> names;
  for (int l = 0; l < g.L; l++)
    for (const char* lin : {"attn/qkv", "attn/proj", "mlp/fc", "mlp/proj"})
      names.push_back("h." + std::to_string(l) + "/" + lin);
  const int Cl = g.C / g.tp.size;
  Fp8Context* f = new Fp8Context;
  fp8_create(*f, recipe, names, N, std::max(g.C, 4 * Cl), std::max(g.C, 4 * Cl), s);
  return f;
}

void gpt_create(GPT& m, const GPTLayout& layout, DType dt, Recompute recompute, int B, int T,
                ops::Stream s, const Fp8Recipe* fp8) {
  m.stream = s;
  m.layout = layout;
  m.dt = dt;
  m.recompute = recompute;
  m.B = B;
  m.T = T;
  const TensorParallel& tp = layout.tp;
  const size_t N = (size_t)B * T, Nt = tp.tokens((int)N), C = layout.C, a = dtype_size(dt);
  const size_t Cl = C / tp.size;

  // Recompute shares one set of the recomputed buffers across layers.
  LayerActs shared{};
  if (recompute == Recompute::Block) shared = new_layer_acts(m, true);
  void* shared_gelu =
      recompute == Recompute::Gelu ? new_buffer<void*>(m, N * 4 * Cl * a) : nullptr;
  for (int l = 0; l < layout.L; l++) {
    LayerActs x = recompute == Recompute::Block ? shared
                                                : new_layer_acts(m, recompute == Recompute::None);
    if (recompute == Recompute::Gelu) x.fch_gelu = shared_gelu;
    x.r3 = new_buffer<void*>(m, Nt * C * a);
    m.layers.push_back(x);
  }
  m.encoded = new_buffer<void*>(m, Nt * C * a);
  m.lnf = new_buffer<void*>(m, Nt * C * a);
  m.lnf_mean = new_buffer<float*>(m, Nt * 4);
  m.lnf_rstd = new_buffer<float*>(m, Nt * 4);
  m.logits = new_buffer<void*>(m, N * layout.Vp_local * a);
  m.losses = new_buffer<float*>(m, N * 4);
  m.loss_sum = new_buffer<float*>(m, 4);
  m.tokens = new_buffer<int*>(m, N * 4);
  m.targets = new_buffer<int*>(m, N * 4);
  if (tp.active()) {
    m.vocab_row = new_buffer<void*>(m, layout.Vp * a);
    m.ce_stats = new_buffer<float*>(m, N * 3 * 4);
    m.ce_parts = new_buffer<float*>(m, tp.size * N * 3 * 4);
    m.partial = new_buffer<void*>(m, N * C * a);
    if (tp.sp) m.gathered = new_buffer<void*>(m, N * C * a);
  }
  m.dresidual = new_buffer<void*>(m, Nt * C * a);
  m.dln = new_buffer<void*>(m, Nt * C * a);
  m.dln_all = tp.active() ? new_buffer<void*>(m, N * C * a) : m.dln;
  m.datty = new_buffer<void*>(m, N * Cl * a);
  m.dqkv = new_buffer<void*>(m, N * 3 * Cl * a);
  m.dfch = new_buffer<void*>(m, N * 4 * Cl * a);
  if (fp8) {
    CHECK(dt == DType::BF16, "FP8 GEMMs run inside a bf16 model, not %s", dtype_name(dt));
    m.fp8 = new_fp8(layout, *fp8, (int)N, s);
    m.activation_bytes += m.fp8->bytes;
  }
  ops::stream_sync(s);
}

void gpt_destroy(GPT& m) {
  if (m.fp8) {
    fp8_destroy(*m.fp8);
    delete m.fp8;
    m.fp8 = nullptr;
  }
  for (void* p : m.owned) ops::release(p);
  m.owned.clear();
  m.layers.clear();
}

// ---------------------------------------------------------------------------------------------
// Forward
// ---------------------------------------------------------------------------------------------
// Address of tensor `i` of unit `u` inside a flat buffer of element size `elem`.
static void* tensor_at(void* base, const ParamUnit& u, int i, size_t elem) {
  return (char*)base + u.tensors[i].offset * elem;
}

struct BlockWeights {
  void* w[kBlockTensors];
};
static BlockWeights block_weights(const GPT& m, int l, void* base) {
  BlockWeights bw;
  for (int i = 0; i < kBlockTensors; i++)
    bw.w[i] = tensor_at(base, m.layout.units[1 + l], i, dtype_size(m.dt));
  return bw;
}

// The block GEMMs: in the compute dtype (ops::matmul_*), or with FP8 operands (model/fp8.h).
// `site` numbers the linear layers for their FP8 scales (BlockLinear, model/gpt.h).

static void linear_forward(GPT& m, int site, void* out, void* pre_gelu, const void* inp,
                           const void* weight, const void* bias, const void* residual, int N,
                           int C, int OC, ops::Stream s) {
  if (m.fp8) fp8_linear_forward(*m.fp8, site, out, pre_gelu, inp, weight, bias, residual, N, C,
                                OC, s);
  else ops::matmul_forward(out, pre_gelu, inp, weight, bias, residual, N, C, OC, m.dt, s);
}

static void linear_backward(GPT& m, int site, void* dinp, float* dweight, float* dbias,
                            const void* dout, const void* inp, const void* weight,
                            const void* gelu_input, int N, int C, int OC, ops::Stream s) {
  if (m.fp8) fp8_linear_backward(*m.fp8, site, dinp, dweight, dbias, dout, inp, weight,
                                 gelu_input, N, C, OC, s);
  else ops::matmul_backward(dinp, dweight, dbias, dout, inp, weight, gelu_input, N, C, OC, m.dt,
                            s);
}

// A row-parallel linear layer (attention and MLP projections): out = inp W^T + bias + residual,
// its partial products summed over tp first (parallel/tensor_parallel.cu).
static void row_parallel_forward(GPT& m, int site, void* out, const void* inp, const void* weight,
                                 const void* bias, const void* residual, int N, int K, int C,
                                 ops::Stream s) {
  const TensorParallel& tp = m.layout.tp;
  if (!tp.active()) return linear_forward(m, site, out, nullptr, inp, weight, bias, residual, N,
                                          K, C, s);
  linear_forward(m, site, m.partial, nullptr, inp, weight, nullptr, nullptr, N, K, C, s);
  tp_row_parallel_finish(tp, out, m.partial, bias, residual, N, C, m.dt, s);
}

static const void* block_input(const GPT& m, int l) {
  return l == 0 ? m.encoded : m.layers[l - 1].r3;
}

// Runs block l. With write_output = false the last GEMM (r3) is skipped: a block recomputed for
// its backward needs everything but its output, which is already kept. Under tensor parallelism
// the GEMMs see this rank's heads / hidden columns (Cl = C/tp) and tp_all_tokens and
// row_parallel_forward move the activations (parallel/tensor_parallel.cu).
static void block_forward(GPT& m, int l, const BlockWeights& bw, int B, int T, bool write_output,
                          ops::Stream s) {
  const GPTLayout& g = m.layout;
  const TensorParallel& tp = g.tp;
  const int C = g.C, Cl = C / tp.size, HS = C / g.NH, N = B * T, Nt = tp.tokens(N);
  const DType dt = m.dt;
  const void* x = block_input(m, l);
  LayerActs& a = m.layers[l];
  void* const* w = bw.w;
  const int site = kBlockLinears * l;
  ops::layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, x, w[kLn1W], w[kLn1B], Nt, C, dt, s);
  const void* ln1 = tp_all_tokens(tp, m.gathered, a.ln1, N, C, dt, s);
  linear_forward(m, site + kQkvLinear, a.qkv, nullptr, ln1, w[kQkvW], w[kQkvB], nullptr, N, C,
                 3 * Cl, s);
  ops::attention_forward(a.atty, a.lse, a.qkv, B, T, g.NH_local, HS, dt, s);
  row_parallel_forward(m, site + kAttnProjLinear, a.r2, a.atty, w[kAttnProjW], w[kAttnProjB], x,
                       N, Cl, C, s);
  ops::layernorm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.r2, w[kLn2W], w[kLn2B], Nt, C, dt, s);
  const void* ln2 = tp_all_tokens(tp, m.gathered, a.ln2, N, C, dt, s);
  linear_forward(m, site + kFcLinear, a.fch_gelu, a.fch, ln2, w[kFcW], w[kFcB], nullptr, N, C,
                 4 * Cl, s);
  if (write_output)
    row_parallel_forward(m, site + kFcProjLinear, a.r3, a.fch_gelu, w[kFcProjW], w[kFcProjB],
                         a.r2, N, 4 * Cl, C, s);
}

// Embedding, every block, final LayerNorm and the logits. Leaves the root unit acquired (the
// caller releases it: right away for a forward-only pass, after the backward when training).
// Returns the final LayerNorm's output over all tokens (the logits GEMM's input).
static const void* forward_to_logits(GPT& m, ParamStore& store, void* root, int B, int T,
                                     ops::Stream s) {
  const GPTLayout& g = m.layout;
  const ParamUnit& ru = g.units[0];
  const size_t e = dtype_size(m.dt);
  const int N = B * T;
  ops::range_push("forward");
  tp_embedding_forward(g.tp, m.encoded, m.partial, m.tokens, tensor_at(root, ru, kWte, e),
                       tensor_at(root, ru, kWpe, e), B, T, g.C, g.vocab_first, g.Vp_local, m.dt,
                       s);
  for (int l = 0; l < g.L; l++) {
    void* w = params_acquire(store, 1 + l, Phase::Forward);
    block_forward(m, l, block_weights(m, l, w), B, T, true, s);
    params_release(store, 1 + l, Phase::Forward);
  }
  ops::layernorm_forward(m.lnf, m.lnf_mean, m.lnf_rstd, m.layers[g.L - 1].r3,
                         tensor_at(root, ru, kLnfW, e), tensor_at(root, ru, kLnfB, e),
                         g.tp.tokens(N), g.C, m.dt, s);
  const void* lnf = tp_all_tokens(g.tp, m.gathered, m.lnf, N, g.C, m.dt, s);
  ops::matmul_forward(m.logits, nullptr, lnf, tensor_at(root, ru, kWte, e), nullptr, nullptr, N,
                      g.C, g.Vp_local, m.dt, s);
  ops::range_pop();
  return lnf;
}

static void upload_batch(GPT& m, const int* tokens, const int* targets, int B, int T,
                         ops::Stream s) {
  CHECK(B <= m.B && T <= m.T, "batch %dx%d exceeds the model's buffers %dx%d", B, T, m.B, m.T);
  ops::copy_to_device_async(m.tokens, tokens, (size_t)B * T * sizeof(int), s);
  if (targets) ops::copy_to_device_async(m.targets, targets, (size_t)B * T * sizeof(int), s);
}

// The loss (and with dloss != 0 its gradient, over the logits), vocabulary-parallel under tp.
static void cross_entropy(GPT& m, float dloss, int N, ops::Stream s) {
  const GPTLayout& g = m.layout;
  tp_cross_entropy(g.tp, m.logits, m.losses, m.ce_stats, m.ce_parts, m.targets, dloss, N, g.V,
                   g.Vp_local, g.vocab_first, m.dt, s);
}

void gpt_forward(GPT& m, ParamStore& store, const int* tokens, const int* targets, int B, int T,
                 ops::Stream s) {
  upload_batch(m, tokens, targets, B, T, s);
  void* root = params_acquire(store, 0, Phase::Forward);
  forward_to_logits(m, store, root, B, T, s);
  if (targets) cross_entropy(m, 0.0f, B * T, s);
  params_release(store, 0, Phase::Forward);
}

std::vector<float> gpt_logits_row(GPT& m, int n, ops::Stream s) {
  const GPTLayout& g = m.layout;
  const size_t e = dtype_size(m.dt);
  const void* src = (const char*)m.logits + (size_t)n * g.Vp_local * e;
  if (g.tp.active()) {  // every rank's vocabulary columns, in rank order
    all_gather(*g.tp.comm, src, m.vocab_row, g.Vp_local, m.dt, s);
    src = m.vocab_row;
  }
  std::vector<unsigned char> raw(g.Vp * e);
  ops::stream_sync(s);
  ops::copy_to_host(raw.data(), src, g.Vp * e);
  std::vector<float> row(g.V);
  for (int j = 0; j < g.V; j++) row[j] = element_as_float(raw.data(), j, m.dt);
  return row;
}

// ---------------------------------------------------------------------------------------------
// Backward
// ---------------------------------------------------------------------------------------------
// Block l's backward. On entry m.dresidual holds d(r3); on exit d(x). Weight gradients are
// accumulated into `g` (the unit's fp32 gradient buffer). Under tensor parallelism each
// row-parallel GEMM first needs dY over all tokens (g backward: tp_all_tokens) and each
// column-parallel GEMM's dX is a partial sum over the ranks (f backward: tp_sum_partials); the
// column-parallel GEMMs' inputs are gathered again for their weight gradients.
static void block_backward(GPT& m, int l, const BlockWeights& bw, float* g, int B, int T,
                           ops::Stream s) {
  const GPTLayout& lay = m.layout;
  const TensorParallel& tp = lay.tp;
  const int C = lay.C, Cl = C / tp.size, HS = C / lay.NH, N = B * T, Nt = tp.tokens(N);
  const DType dt = m.dt;
  const ParamUnit& u = lay.units[1 + l];
  auto grad = [&](int i) { return g + u.tensors[i].offset; };
  const void* x = block_input(m, l);
  LayerActs& a = m.layers[l];
  void* const* w = bw.w;
  void* dres = m.dresidual;
  const int site = kBlockLinears * l;
  // r3 = r2 + fcproj(gelu(fch)): d fch = (dres @ Wp) * gelu'(fch), fused in the GEMM
  const void* dr3 = tp_all_tokens(tp, m.gathered, dres, N, C, dt, s);
  linear_backward(m, site + kFcProjLinear, m.dfch, grad(kFcProjW), grad(kFcProjB), dr3,
                  a.fch_gelu, w[kFcProjW], a.fch, N, 4 * Cl, C, s);
  const void* ln2 = tp_all_tokens(tp, m.gathered, a.ln2, N, C, dt, s);
  linear_backward(m, site + kFcLinear, m.dln_all, grad(kFcW), grad(kFcB), m.dfch, ln2, w[kFcW],
                  nullptr, N, C, 4 * Cl, s);
  const void* dln2 = tp_sum_partials(tp, m.dln_all, m.dln, N, C, dt, s);
  ops::layernorm_backward(dres, grad(kLn2W), grad(kLn2B), dln2, a.r2, w[kLn2W], a.ln2_mean,
                          a.ln2_rstd, Nt, C, dt, s);  // dres is now d(r2)
  const void* dr2 = tp_all_tokens(tp, m.gathered, dres, N, C, dt, s);
  linear_backward(m, site + kAttnProjLinear, m.datty, grad(kAttnProjW), grad(kAttnProjB), dr2,
                  a.atty, w[kAttnProjW], nullptr, N, Cl, C, s);
  ops::attention_backward(m.dqkv, m.datty, a.qkv, a.atty, a.lse, B, T, lay.NH_local, HS, dt, s);
  const void* ln1 = tp_all_tokens(tp, m.gathered, a.ln1, N, C, dt, s);
  linear_backward(m, site + kQkvLinear, m.dln_all, grad(kQkvW), grad(kQkvB), m.dqkv, ln1,
                  w[kQkvW], nullptr, N, C, 3 * Cl, s);
  const void* dln1 = tp_sum_partials(tp, m.dln_all, m.dln, N, C, dt, s);
  ops::layernorm_backward(dres, grad(kLn1W), grad(kLn1B), dln1, x, w[kLn1W], a.ln1_mean,
                          a.ln1_rstd, Nt, C, dt, s);  // dres is now d(x)
}

// The output layer's backward: logits = lnf @ wte^T (lnf over all tokens), lnf = LN(x_L).
// Leaves d(x_L) in m.dresidual.
static void head_backward(GPT& m, void* root, float* groot, const void* lnf, int N,
                          ops::Stream s) {
  const GPTLayout& g = m.layout;
  const ParamUnit& ru = g.units[0];
  const size_t e = dtype_size(m.dt);
  const int Nt = g.tp.tokens(N);
  ops::matmul_backward(m.dln_all, groot + ru.tensors[kWte].offset, nullptr, m.logits, lnf,
                       tensor_at(root, ru, kWte, e), nullptr, N, g.C, g.Vp_local, m.dt, s);
  const void* dlnf = tp_sum_partials(g.tp, m.dln_all, m.dln, N, g.C, m.dt, s);
  ops::fill_zero(m.dresidual, (size_t)Nt * g.C * e, s);
  ops::layernorm_backward(m.dresidual, groot + ru.tensors[kLnfW].offset,
                          groot + ru.tensors[kLnfB].offset, dlnf, m.layers[g.L - 1].r3,
                          tensor_at(root, ru, kLnfW, e), m.lnf_mean, m.lnf_rstd, Nt, g.C, m.dt,
                          s);
}

void gpt_forward_backward(GPT& m, ParamStore& store, const int* tokens, const int* targets, int B,
                          int T, float dloss, float loss_scale_for_log, bool last_micro_step,
                          ops::Stream s) {
  const GPTLayout& g = m.layout;
  const ParamUnit& ru = g.units[0];
  const int N = B * T;
  upload_batch(m, tokens, targets, B, T, s);
  void* root = params_acquire(store, 0, Phase::Forward);
  const void* lnf = forward_to_logits(m, store, root, B, T, s);

  // Loss and d(logits) in one pass, then the head.
  cross_entropy(m, dloss, N, s);
  ops::sum_accumulate(m.loss_sum, m.losses, N, loss_scale_for_log, s);
  ops::range_push("backward");
  float* groot = grads_acquire(store, 0);
  head_backward(m, root, groot, lnf, N, s);

  for (int l = g.L - 1; l >= 0; l--) {
    void* w = params_acquire(store, 1 + l, Phase::Backward);
    float* gw = grads_acquire(store, 1 + l);
    BlockWeights bw = block_weights(m, l, w);
    if (m.recompute == Recompute::Block) block_forward(m, l, bw, B, T, false, s);
    if (m.recompute == Recompute::Gelu)
      ops::gelu_forward(m.layers[l].fch_gelu, m.layers[l].fch, (size_t)N * 4 * g.C / g.tp.size,
                        m.dt, s);
    block_backward(m, l, bw, gw, B, T, s);
    params_release(store, 1 + l, Phase::Backward);
    grads_release(store, 1 + l, last_micro_step);
  }

  // The tied embedding receives its second gradient contribution here.
  tp_embedding_backward(g.tp, groot + ru.tensors[kWte].offset, groot + ru.tensors[kWpe].offset,
                        m.gathered, m.dresidual, m.tokens, B, T, g.C, g.vocab_first, g.Vp_local,
                        m.dt, s);
  grads_release(store, 0, last_micro_step);
  params_release(store, 0, Phase::Backward);
  ops::range_pop();
}
