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
#include "model/gpt.h"

#include <cmath>

#include "parallel/param_store.h"

// ---------------------------------------------------------------------------------------------
// Layout
// ---------------------------------------------------------------------------------------------
static void add_tensor(ParamUnit& u, const std::string& name, int64_t rows, int64_t cols,
                       bool decay, float std, float value, int64_t init_rows) {
  ParamTensor t;
  t.name = name;
  t.rows = rows;
  t.cols = cols;
  t.offset = round_up(u.numel, kTensorAlign);
  t.decay = decay;
  t.init_std = std;
  t.init_value = value;
  t.init_rows = init_rows;
  u.numel = t.offset + t.numel();
  if (decay) u.decay_numel = u.numel;
  u.tensors.push_back(t);
}

GPTLayout gpt_layout(const ModelConfig& m) {
  GPTLayout g;
  g.L = m.n_layer;
  g.NH = m.n_head;
  g.C = m.d_model;
  g.T = m.seq_len;
  g.V = m.vocab_size;
  g.Vp = m.padded_vocab();
  const int64_t C = g.C;
  const float std = 0.02f, proj_std = 0.02f / std::sqrt(2.0f * g.L);

  ParamUnit root;  // order must match RootTensor
  add_tensor(root, "wte", g.Vp, C, true, std, 0, g.V);  // padded rows start at zero
  add_tensor(root, "wpe", g.T, C, true, std, 0, g.T);
  add_tensor(root, "ln_f/weight", C, 1, false, 0, 1, 0);
  add_tensor(root, "ln_f/bias", C, 1, false, 0, 0, 0);
  root.numel = round_up(root.numel, kTensorAlign);
  g.units.push_back(root);

  for (int l = 0; l < g.L; l++) {
    ParamUnit u;  // order must match BlockTensor: decayed matrices first
    std::string h = "h." + std::to_string(l) + "/";
    add_tensor(u, h + "attn/qkv/weight", 3 * C, C, true, std, 0, 3 * C);
    add_tensor(u, h + "attn/proj/weight", C, C, true, proj_std, 0, C);
    add_tensor(u, h + "mlp/fc/weight", 4 * C, C, true, std, 0, 4 * C);
    add_tensor(u, h + "mlp/proj/weight", C, 4 * C, true, proj_std, 0, C);
    add_tensor(u, h + "ln_1/weight", C, 1, false, 0, 1, 0);
    add_tensor(u, h + "ln_1/bias", C, 1, false, 0, 0, 0);
    add_tensor(u, h + "attn/qkv/bias", 3 * C, 1, false, 0, 0, 0);
    add_tensor(u, h + "attn/proj/bias", C, 1, false, 0, 0, 0);
    add_tensor(u, h + "ln_2/weight", C, 1, false, 0, 1, 0);
    add_tensor(u, h + "ln_2/bias", C, 1, false, 0, 0, 0);
    add_tensor(u, h + "mlp/fc/bias", 4 * C, 1, false, 0, 0, 0);
    add_tensor(u, h + "mlp/proj/bias", C, 1, false, 0, 0, 0);
    u.numel = round_up(u.numel, kTensorAlign);
    g.units.push_back(u);
  }
  return g;
}

size_t GPTLayout::num_parameters() const {
  size_t n = 0;
  for (const ParamUnit& u : units)
    for (const ParamTensor& t : u.tensors) n += t.numel();
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
static LayerActs new_layer_acts(GPT& m, bool with_gelu) {
  const size_t N = (size_t)m.B * m.T, C = m.layout.C, a = dtype_size(m.dt);
  LayerActs x{};
  x.ln1 = new_buffer<void*>(m, N * C * a);
  x.qkv = new_buffer<void*>(m, N * 3 * C * a);
  x.atty = new_buffer<void*>(m, N * C * a);
  x.r2 = new_buffer<void*>(m, N * C * a);
  x.ln2 = new_buffer<void*>(m, N * C * a);
  x.fch = new_buffer<void*>(m, N * 4 * C * a);
  x.fch_gelu = with_gelu ? new_buffer<void*>(m, N * 4 * C * a) : nullptr;
  x.ln1_mean = new_buffer<float*>(m, N * 4);
  x.ln1_rstd = new_buffer<float*>(m, N * 4);
  x.ln2_mean = new_buffer<float*>(m, N * 4);
  x.ln2_rstd = new_buffer<float*>(m, N * 4);
  x.lse = new_buffer<float*>(m, N * m.layout.NH * 4);
  return x;
}

void gpt_create(GPT& m, const GPTLayout& layout, DType dt, Recompute recompute, int B, int T,
                ops::Stream s) {
  m.stream = s;
  m.layout = layout;
  m.dt = dt;
  m.recompute = recompute;
  m.B = B;
  m.T = T;
  const size_t N = (size_t)B * T, C = layout.C, a = dtype_size(dt);

  // Recompute shares one set of the recomputed buffers across layers.
  LayerActs shared{};
  if (recompute == Recompute::Block) shared = new_layer_acts(m, true);
  void* shared_gelu = recompute == Recompute::Gelu ? new_buffer<void*>(m, N * 4 * C * a) : nullptr;
  for (int l = 0; l < layout.L; l++) {
    LayerActs x = recompute == Recompute::Block ? shared
                                                : new_layer_acts(m, recompute == Recompute::None);
    if (recompute == Recompute::Gelu) x.fch_gelu = shared_gelu;
    x.r3 = new_buffer<void*>(m, N * C * a);
    m.layers.push_back(x);
  }
  m.encoded = new_buffer<void*>(m, N * C * a);
  m.lnf = new_buffer<void*>(m, N * C * a);
  m.lnf_mean = new_buffer<float*>(m, N * 4);
  m.lnf_rstd = new_buffer<float*>(m, N * 4);
  m.logits = new_buffer<void*>(m, N * layout.Vp * a);
  m.losses = new_buffer<float*>(m, N * 4);
  m.loss_sum = new_buffer<float*>(m, 4);
  m.tokens = new_buffer<int*>(m, N * 4);
  m.targets = new_buffer<int*>(m, N * 4);
  m.dresidual = new_buffer<void*>(m, N * C * a);
  m.dln = new_buffer<void*>(m, N * C * a);
  m.datty = new_buffer<void*>(m, N * C * a);
  m.dqkv = new_buffer<void*>(m, N * 3 * C * a);
  m.dfch = new_buffer<void*>(m, N * 4 * C * a);
  ops::stream_sync(s);
}

void gpt_destroy(GPT& m) {
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

static const void* block_input(const GPT& m, int l) {
  return l == 0 ? m.encoded : m.layers[l - 1].r3;
}

// Runs block l. With write_output = false the last GEMM (r3) is skipped: a block recomputed for
// its backward needs everything but its output, which is already kept.
static void block_forward(GPT& m, int l, const BlockWeights& bw, int B, int T, bool write_output,
                          ops::Stream s) {
  const int C = m.layout.C, NH = m.layout.NH, N = B * T;
  const DType dt = m.dt;
  const void* x = block_input(m, l);
  LayerActs& a = m.layers[l];
  void* const* w = bw.w;
  ops::layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, x, w[kLn1W], w[kLn1B], N, C, dt, s);
  ops::matmul_forward(a.qkv, nullptr, a.ln1, w[kQkvW], w[kQkvB], nullptr, N, C, 3 * C, dt, s);
  ops::attention_forward(a.atty, a.lse, a.qkv, B, T, NH, C / NH, dt, s);
  ops::matmul_forward(a.r2, nullptr, a.atty, w[kAttnProjW], w[kAttnProjB], x, N, C, C, dt, s);
  ops::layernorm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.r2, w[kLn2W], w[kLn2B], N, C, dt, s);
  ops::matmul_forward(a.fch_gelu, a.fch, a.ln2, w[kFcW], w[kFcB], nullptr, N, C, 4 * C, dt, s);
  if (write_output)
    ops::matmul_forward(a.r3, nullptr, a.fch_gelu, w[kFcProjW], w[kFcProjB], a.r2, N, 4 * C, C,
                        dt, s);
}

// Embedding, every block, final LayerNorm and the logits. Leaves the root unit acquired (the
// caller releases it: right away for a forward-only pass, after the backward when training).
static void forward_to_logits(GPT& m, ParamStore& store, void* root, int B, int T,
                              ops::Stream s) {
  const GPTLayout& g = m.layout;
  const ParamUnit& ru = g.units[0];
  const size_t e = dtype_size(m.dt);
  const int N = B * T;
  ops::range_push("forward");
  ops::encoder_forward(m.encoded, m.tokens, tensor_at(root, ru, kWte, e),
                       tensor_at(root, ru, kWpe, e), B, T, g.C, m.dt, s);
  for (int l = 0; l < g.L; l++) {
    void* w = params_acquire(store, 1 + l, Phase::Forward);
    block_forward(m, l, block_weights(m, l, w), B, T, true, s);
    params_release(store, 1 + l, Phase::Forward);
  }
  ops::layernorm_forward(m.lnf, m.lnf_mean, m.lnf_rstd, m.layers[g.L - 1].r3,
                         tensor_at(root, ru, kLnfW, e), tensor_at(root, ru, kLnfB, e), N, g.C,
                         m.dt, s);
  ops::matmul_forward(m.logits, nullptr, m.lnf, tensor_at(root, ru, kWte, e), nullptr, nullptr, N,
                      g.C, g.Vp, m.dt, s);
  ops::range_pop();
}

static void upload_batch(GPT& m, const int* tokens, const int* targets, int B, int T,
                         ops::Stream s) {
  CHECK(B <= m.B && T <= m.T, "batch %dx%d exceeds the model's buffers %dx%d", B, T, m.B, m.T);
  ops::copy_to_device_async(m.tokens, tokens, (size_t)B * T * sizeof(int), s);
  if (targets) ops::copy_to_device_async(m.targets, targets, (size_t)B * T * sizeof(int), s);
}

void gpt_forward(GPT& m, ParamStore& store, const int* tokens, const int* targets, int B, int T,
                 ops::Stream s) {
  upload_batch(m, tokens, targets, B, T, s);
  void* root = params_acquire(store, 0, Phase::Forward);
  forward_to_logits(m, store, root, B, T, s);
  if (targets)
    ops::classifier_forward_backward(m.logits, m.losses, m.targets, 0.0f, B * T, m.layout.V,
                                     m.layout.Vp, m.dt, s);
  params_release(store, 0, Phase::Forward);
}

// ---------------------------------------------------------------------------------------------
// Backward
// ---------------------------------------------------------------------------------------------
// Block l's backward. On entry m.dresidual holds d(r3); on exit d(x). Weight gradients are
// accumulated into `g` (the unit's fp32 gradient buffer).
static void block_backward(GPT& m, int l, const BlockWeights& bw, float* g, int B, int T,
                           ops::Stream s) {
  const int C = m.layout.C, NH = m.layout.NH, N = B * T;
  const DType dt = m.dt;
  const ParamUnit& u = m.layout.units[1 + l];
  auto grad = [&](int i) { return g + u.tensors[i].offset; };
  const void* x = block_input(m, l);
  LayerActs& a = m.layers[l];
  void* const* w = bw.w;
  void* dres = m.dresidual;
  // r3 = r2 + fcproj(gelu(fch)): d fch = (dres @ Wp) * gelu'(fch), fused in the GEMM
  ops::matmul_backward(m.dfch, grad(kFcProjW), grad(kFcProjB), dres, a.fch_gelu, w[kFcProjW],
                       a.fch, N, 4 * C, C, dt, s);
  ops::matmul_backward(m.dln, grad(kFcW), grad(kFcB), m.dfch, a.ln2, w[kFcW], nullptr, N, C,
                       4 * C, dt, s);
  ops::layernorm_backward(dres, grad(kLn2W), grad(kLn2B), m.dln, a.r2, w[kLn2W], a.ln2_mean,
                          a.ln2_rstd, N, C, dt, s);  // dres is now d(r2)
  ops::matmul_backward(m.datty, grad(kAttnProjW), grad(kAttnProjB), dres, a.atty, w[kAttnProjW],
                       nullptr, N, C, C, dt, s);
  ops::attention_backward(m.dqkv, m.datty, a.qkv, a.atty, a.lse, B, T, NH, C / NH, dt, s);
  ops::matmul_backward(m.dln, grad(kQkvW), grad(kQkvB), m.dqkv, a.ln1, w[kQkvW], nullptr, N, C,
                       3 * C, dt, s);
  ops::layernorm_backward(dres, grad(kLn1W), grad(kLn1B), m.dln, x, w[kLn1W], a.ln1_mean,
                          a.ln1_rstd, N, C, dt, s);  // dres is now d(x)
}

void gpt_forward_backward(GPT& m, ParamStore& store, const int* tokens, const int* targets, int B,
                          int T, float dloss, float loss_scale_for_log, bool last_micro_step,
                          ops::Stream s) {
  const GPTLayout& g = m.layout;
  const ParamUnit& ru = g.units[0];
  const size_t e = dtype_size(m.dt);
  const int N = B * T;
  upload_batch(m, tokens, targets, B, T, s);
  void* root = params_acquire(store, 0, Phase::Forward);
  forward_to_logits(m, store, root, B, T, s);

  // Loss and d(logits) in one pass, then the head: logits = lnf @ wte^T, lnf = LN(x_L).
  ops::classifier_forward_backward(m.logits, m.losses, m.targets, dloss, N, g.V, g.Vp, m.dt, s);
  ops::sum_accumulate(m.loss_sum, m.losses, N, loss_scale_for_log, s);
  ops::range_push("backward");
  float* groot = grads_acquire(store, 0);
  ops::matmul_backward(m.dln, groot + ru.tensors[kWte].offset, nullptr, m.logits, m.lnf,
                       tensor_at(root, ru, kWte, e), nullptr, N, g.C, g.Vp, m.dt, s);
  ops::fill_zero(m.dresidual, (size_t)N * g.C * e, s);
  ops::layernorm_backward(m.dresidual, groot + ru.tensors[kLnfW].offset,
                          groot + ru.tensors[kLnfB].offset, m.dln, m.layers[g.L - 1].r3,
                          tensor_at(root, ru, kLnfW, e), m.lnf_mean, m.lnf_rstd, N, g.C, m.dt, s);

  for (int l = g.L - 1; l >= 0; l--) {
    void* w = params_acquire(store, 1 + l, Phase::Backward);
    float* gw = grads_acquire(store, 1 + l);
    BlockWeights bw = block_weights(m, l, w);
    if (m.recompute == Recompute::Block) block_forward(m, l, bw, B, T, false, s);
    if (m.recompute == Recompute::Gelu)
      ops::gelu_forward(m.layers[l].fch_gelu, m.layers[l].fch, (size_t)N * 4 * g.C, m.dt, s);
    block_backward(m, l, bw, gw, B, T, s);
    params_release(store, 1 + l, Phase::Backward);
    grads_release(store, 1 + l, last_micro_step);
  }

  // The tied embedding receives its second gradient contribution here.
  ops::encoder_backward(groot + ru.tensors[kWte].offset, groot + ru.tensors[kWpe].offset,
                        m.dresidual, m.tokens, B, T, g.C, m.dt, s);
  grads_release(store, 0, last_micro_step);
  params_release(store, 0, Phase::Backward);
  ops::range_pop();
}
