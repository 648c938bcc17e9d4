// model/gpt.cu - GPT-2 forward and backward over the backend seam (kernels/ops.h).
//
// One block, pre-LayerNorm, with the residual adds fused into the GEMM epilogues:
//
//   ln1 = LN(x)                    qkv = ln1 Wqkv^T + b          atty = causal_attention(qkv)
//   r2  = x + (atty Wo^T + b)      ln2 = LN(r2)                  fch  = ln2 Wfc^T + b
//   r3  = r2 + (gelu(fch) Wp^T + b)                              r3 is the next block's x
//
// and on top the head (model/gpt_head.cu): lnf = LN(x_L), logits = lnf wte^T (tied), loss =
// cross-entropy over the first V columns.
//
// Llama (layout.llama) is the same graph with four substitutions and no biases:
//
//   ln1 = RMSNorm(x)               qkv = ln1 Wqkv^T, then RoPE on its q and k heads at each token's
//   global position                atty = causal_attention(qkv) with NKV <= NH key/value heads
//   fch = ln2 Wfc^T = [gate | up]  swiglu = silu(gate) * up       r3 = r2 + swiglu Wp^T
//
// and on top RMSNorm and the untied head lm_head (or wte when tied). The RoPE tables are made
// once on the host in double (model/rope.h) and uploaded into the model's memory.
//
// The backward walks the same graph in reverse with one residual-gradient buffer
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
// Sampling with a KV cache (model/kv_cache.h) takes three detours while model.kv is set: the
// embedding's and RoPE's positions start at the cache's position, and attention appends the new
// keys and values to the cache and attends over it.
//
// Tensor parallelism (layout.tp, parallel/tensor_parallel.cu) shows up here only as local shapes
// (this rank's heads, MLP columns and vocabulary rows) and as the calls of the parallel layers:
// a block is column_parallel_forward (qkv), attention, row_parallel_forward (proj),
// column_parallel_forward (fc + GELU), row_parallel_forward (fc proj), the head a column-parallel
// GEMM over the vocabulary, and the embedding and the loss are vocabulary-parallel. They move
// whatever must cross the tp group; with tp = 1 they are the plain one-rank layers. Each linear
// gets its GEMM as a LinearGemm (block_gemm): in the compute dtype or, with [precision] compute =
// "fp8", on FP8 operands (model/fp8.h). Attention goes through the context-parallel entry point
// (parallel/context_parallel.h), the plain kernel with one cp rank: nothing here branches on an
// axis.
#include "model/gpt.h"

#include <algorithm>
#include <cmath>

#include "model/fp8.h"
#include "model/gpt_parts.h"
#include "model/kv_cache.h"
#include "model/rope.h"
#include "parallel/context_parallel.h"
#include "parallel/param_store.h"

// ---------------------------------------------------------------------------------------------
// Activations
// ---------------------------------------------------------------------------------------------
template <typename Ptr>
static Ptr new_buffer(GPT& m, size_t bytes) {
  return (Ptr)allocate_zeroed(m.memory, bytes, m.stream);
}

void* gpt_new_buffer(GPT& m, size_t bytes) { return new_buffer<void*>(m, bytes); }

// One full set of a layer's activations. `r3` is allocated separately (it is always kept), and
// so are an MoE block's (moe). Nt = the tokens this rank holds in the residual stream, N = all
// tokens, Cl = C / tp. with_mlp false: no dense MLP (an MoE block without shared experts).
static LayerActs new_layer_acts(GPT& m, bool with_gelu, bool with_mlp = true) {
  const GPTLayout& g = m.layout;
  const size_t N = (size_t)m.B * m.T, Nt = g.tp.tokens((int)N), C = g.C;
  const size_t Cl = C / g.tp.size(), a = dtype_size(m.dt);
  LayerActs x{};
  x.ln1 = new_buffer<void*>(m, Nt * C * a);
  x.qkv = new_buffer<void*>(m, N * g.qkv_local() * a);
  x.atty = new_buffer<void*>(m, N * Cl * a);
  x.r2 = new_buffer<void*>(m, Nt * C * a);
  x.ln2 = new_buffer<void*>(m, Nt * C * a);
  x.fch = with_mlp ? new_buffer<void*>(m, N * g.fc_max() * a) : nullptr;
  x.fch_gelu = with_gelu && with_mlp ? new_buffer<void*>(m, N * g.mlp_max() * a) : nullptr;
  x.ln1_mean = g.llama ? nullptr : new_buffer<float*>(m, Nt * 4);  // RMSNorm: no mean
  x.ln1_rstd = new_buffer<float*>(m, Nt * 4);
  x.ln2_mean = g.llama ? nullptr : new_buffer<float*>(m, Nt * 4);
  x.ln2_rstd = new_buffer<float*>(m, Nt * 4);
  x.lse = new_buffer<float*>(m, N * g.NH_local * 4);
  return x;
}

// The FP8 state of the 4 linear layers of every block (model/fp8.h).
static Fp8Context* new_fp8(const GPTLayout& g, const Fp8Recipe& recipe, int N,
                           Allocator& memory, ops::Stream s) {
  std::vector<std::string> names;
  for (int l = 0; l < g.L; l++)
    for (const char* lin : {"attn/qkv", "attn/proj", "mlp/fc", "mlp/proj"})
      names.push_back("h." + std::to_string(l) + "/" + lin);
  // the widest input and output of a block linear: C, the qkv row, the fc output and proj input
  const int widest = std::max({g.C, g.qkv_local(), g.fc_max(), g.mlp_max()});
  Fp8Context* f = new Fp8Context;
  fp8_create(*f, recipe, names, N, widest, widest, memory, s);
  return f;
}

// The activations of one micro-batch in flight through one chunk. Recompute shares the
// recomputed buffers of every layer of every slot (`shared`).
static ActivationSlot new_slot(GPT& m, const LayerActs& shared, void* shared_gelu) {
  const GPTLayout& g = m.layout;
  const size_t N = (size_t)m.B * m.T, Nt = g.tp.tokens((int)N), a = dtype_size(m.dt);
  ActivationSlot sl;
  sl.input = new_buffer<void*>(m, Nt * g.C * a);
  sl.tokens = new_buffer<int*>(m, N * 4);
  if (m.document_mask) sl.docs = new_buffer<int*>(m, N * g.cp->size * 4);  // the full rows'
  if (m.document_mask && m.document_positions) sl.doc_positions = new_buffer<int*>(m, N * 4);
  for (int j = 0; j < g.max_blocks; j++) {
    // The j-th block of a chunk: dense in some chunk, an MoE block in some (or both).
    bool dense = false, moe = false, mlp = false;  // mlp: a dense MLP or shared experts
    for (int c = 0; c < g.pp.v; c++)
      if (j < g.blocks(c)) {
        (g.moe[g.first_block(c) + j] ? moe : dense) = true;
        mlp = mlp || g.has_mlp(g.first_block(c) + j);
      }
    LayerActs x = m.recompute == Recompute::Block
                      ? shared
                      : new_layer_acts(m, m.recompute == Recompute::None, mlp);
    if (m.recompute == Recompute::Gelu && mlp) x.fch_gelu = shared_gelu;
    x.moe = moe ? moe_new_acts(m) : nullptr;
    x.r3 = new_buffer<void*>(m, Nt * g.C * a);
    sl.layers.push_back(x);
  }
  return sl;
}

// Llama: the RoPE tables (model/rope.h) and, under context parallelism, this rank's global
// positions (its two zigzag chunks of T/(2cp)), into the model's memory. Uploaded on s: a dry
// stream (the planner's) copies nothing, but the bytes are counted.
static void upload_rope(GPT& m, ops::Stream s) {
  const GPTLayout& g = m.layout;
  std::vector<float> cos_table, sin_table;
  rope_tables(cos_table, sin_table, g.maxT, g.HS, g.rope_theta);
  const size_t bytes = cos_table.size() * sizeof(float);
  m.rope_cos = new_buffer<float*>(m, bytes);
  m.rope_sin = new_buffer<float*>(m, bytes);
  ops::copy_to_device_async(m.rope_cos, cos_table.data(), bytes, s);
  ops::copy_to_device_async(m.rope_sin, sin_table.data(), bytes, s);
  if (g.cp->size == 1) return;  // positions are 0 .. T-1: the kernels need no array
  const TokenPositions pos = cp_positions_of(g.cp->size, g.cp->rank, 1, m.T * g.cp->size);
  std::vector<int> positions;
  for (int k = 0; k < pos.chunks; k++)
    for (int t = 0; t < pos.len; t++) positions.push_back(pos.first[k] + t);
  m.positions = new_buffer<int*>(m, positions.size() * sizeof(int));
  ops::copy_to_device_async(m.positions, positions.data(), positions.size() * sizeof(int), s);
  ops::stream_sync(s);  // the host vectors go out of scope
}

void gpt_create(GPT& m, const GPTLayout& layout, DType dt, Recompute recompute, int B, int T,
                ops::Stream s, const Fp8Recipe* fp8, int slots, ops::Stream ring) {
  m.stream = s;
  m.layout = layout;
  m.dt = dt;
  m.recompute = recompute;
  m.B = B;
  m.T = T;
  const TensorParallel& tp = layout.tp;
  const size_t N = (size_t)B * T, Nt = tp.tokens((int)N), C = layout.C, a = dtype_size(dt);
  const size_t Cl = C / tp.size();

  moe_create(m);  // before the slots: their MoE layers' buffers are sized by it
  LayerActs shared{};
  if (recompute == Recompute::Block) shared = new_layer_acts(m, true);
  void* shared_gelu =
      recompute == Recompute::Gelu ? new_buffer<void*>(m, N * layout.mlp_max() * a) : nullptr;
  for (int i = 0; i < slots; i++) m.slots.push_back(new_slot(m, shared, shared_gelu));
  const int grads = m.grad_buffers > 0 ? m.grad_buffers : slots;
  for (int i = 0; i < grads; i++) m.grads.push_back(new_buffer<void*>(m, Nt * C * a));
  for (int i = 0; i < slots; i++) m.slots[i].grad = m.grads[i % grads];  // the pipeline re-lends
  head_create(m);  // model/gpt_head.cu
  m.loss_sum = new_buffer<float*>(m, 4);
  if (tp.active()) {
    m.partial = new_buffer<void*>(m, N * C * a);
    if (tp.sp) m.gathered = new_buffer<void*>(m, N * C * a);
  }
  m.dln = new_buffer<void*>(m, Nt * C * a);
  m.dln_all = tp.active() ? m.partial : m.dln;
  // the backward's scratch (gpt.h): dfch, then datty and dqkv side by side; the head's logits
  const size_t dqkv_at = (N * Cl * a + 255) / 256 * 256;  // aligned for vector loads
  void* scratch = new_buffer<void*>(
      m, std::max({N * layout.fc_max() * a, dqkv_at + N * layout.qkv_local() * a,
                   head_scratch_bytes(m)}));
  m.dfch = scratch;
  m.datty = scratch;
  m.dqkv = (char*)scratch + dqkv_at;
  if (gpt_runs_head(layout)) m.logits = scratch;
  if (layout.llama) {  // d(SwiGLU output) lives while dfch is written: a buffer of its own
    m.dswiglu = new_buffer<void*>(m, N * layout.mlp_max() * a);
    upload_rope(m, s);
  }
  if (m.split_backward)  // the LayerNorms' gradients between B and W (model/gpt_backward.cu)
    m.ln_grads = new_buffer<float*>(m, (size_t)layout.L * 4 * C * sizeof(float));
  if (fp8) {
    CHECK(dt == DType::BF16, "FP8 GEMMs run inside a bf16 model, not %s", dtype_name(dt));
    m.fp8 = new_fp8(layout, *fp8, (int)N, m.memory, s);
  }
  m.cp = new ContextParallel;  // with one cp rank it allocates nothing
  cp_create(*m.cp, layout.cp_ring, B, T * layout.cp->size, layout.NH_local, layout.NKV_local,
            layout.HS, dt, m.memory, ring, layout.cp_a2a);  // the plan is over whole sequences
  tp_overlap_create(m.layout.tp, m.memory, ring);  // [parallel] tp_overlap: its events
  ops::stream_sync(s);
}

DType compute_dtype(const PrecisionConfig& p) {
  if (p.compute == "fp32") return DType::F32;
  if (p.compute == "bf16" || p.compute == "fp8") return DType::BF16;
  BUG("[precision] compute = \"%s\" has no dtype", p.compute.c_str());
}

void gpt_create_from_config(GPT& m, const GPTLayout& layout, const Config& cfg,
                            Comm* amax_group, int slots, ops::Stream s, ops::Stream ring) {
  const PrecisionConfig& p = cfg.precision;
  Fp8Recipe recipe;
  recipe.granularity = fp8_granularity(p.fp8_recipe);
  recipe.delayed = p.fp8_recipe == "delayed";
  recipe.history = p.fp8_amax_history;
  recipe.margin = p.fp8_margin;
  recipe.amax_group = amax_group;
  m.moe_aux_loss = cfg.train.moe_aux_loss;
  m.document_mask = cfg.data.document_mask;
  m.document_positions = cfg.data.document_mask && cfg.data.document_positions;
  m.eot_token = cfg.data.eot_token;
  m.moe_z_loss = cfg.train.moe_z_loss;
  m.moe_router_score =
      cfg.model.router_score == "sigmoid" ? ops::RouterScore::Sigmoid : ops::RouterScore::Softmax;
  m.moe_capacity_factor = cfg.train.moe_capacity_factor;
  m.moe_bias_balance = cfg.train.moe_balance == "bias";
  m.moe_bias_rate = cfg.train.moe_bias_rate;
  gpt_create(m, layout, compute_dtype(p), parse_recompute(cfg.train.recompute),
             cfg.train.micro_batch, cfg.model.seq_len / layout.cp->size, s,
             p.compute == "fp8" ? &recipe : nullptr, slots, ring);
}

void gpt_destroy(GPT& m) {
  moe_destroy(m);
  delete m.fp8;
  m.fp8 = nullptr;
  delete m.cp;
  m.cp = nullptr;
  tp_overlap_destroy(m.layout.tp);
  allocator_free(m.memory);  // every buffer and event of the model's parts
  m.slots.clear();
  m.grads.clear();
}

// ---------------------------------------------------------------------------------------------
// Forward
// ---------------------------------------------------------------------------------------------
// Address of tensor `i` of unit `u` inside a flat buffer of element size `elem` (null: null).
static void* tensor_at(void* base, const ParamUnit& u, int i, size_t elem) {
  return base ? (char*)base + u.tensors[i].offset * elem : nullptr;
}

static BlockWeights block_weights(const GPT& m, int l, void* base) {
  BlockWeights bw;
  const ParamUnit& u = m.layout.units[m.layout.block_unit[l]];
  const std::vector<int>& order = block_tensor_order(m.layout, l);
  for (size_t i = 0; i < order.size(); i++) {
    bw.w[order[i]] = tensor_at(base, u, (int)i, dtype_size(m.dt));
    bw.offset[order[i]] = u.tensors[i].offset;
    bw.has[order[i]] = true;
  }
  return bw;
}
// The expert tensors of MoE block l in a flat buffer of the expert unit (weights: elem =
// dtype size; gradients: 4).
static ExpertWeights expert_tensors(const GPT& m, int l, void* base, size_t elem) {
  const ParamUnit& u = m.layout.units[m.layout.expert_unit[l]];
  if (m.layout.llama)  // SwiGLU experts: no biases
    return {tensor_at(base, u, kExpertFcW, elem), tensor_at(base, u, kExpertProjW, elem), nullptr,
            nullptr};
  return {tensor_at(base, u, kExpertFcW, elem), tensor_at(base, u, kExpertProjW, elem),
          tensor_at(base, u, kExpertFcB, elem), tensor_at(base, u, kExpertProjB, elem)};
}
BlockWeights acquire_block(GPT& m, ParamStore& store, int l, bool weights, bool grads) {
  const int unit = m.layout.block_unit[l], experts = m.layout.expert_unit[l];
  BlockWeights bw = block_weights(m, l, weights ? params_acquire(store, unit) : nullptr);
  if (experts >= 0)
    bw.experts = expert_tensors(m, l, weights ? params_acquire(store, experts) : nullptr,
                                dtype_size(m.dt));
  if (!grads) return bw;
  bw.grads = grads_acquire(store, unit);
  if (experts >= 0) bw.expert_grads = expert_tensors(m, l, grads_acquire(store, experts), 4);
  return bw;
}
void release_block(GPT& m, ParamStore& store, int l, bool weights, bool grads,
                   bool last_micro_step) {
  for (int unit : {m.layout.block_unit[l], m.layout.expert_unit[l]}) {
    if (unit < 0) continue;
    if (weights) params_release(store, unit);
    if (grads) grads_release(store, unit, last_micro_step);
  }
}
void* root_weight(const GPT& m, int i) {
  const RootSlot at = m.layout.root_at[i];
  if (at.unit < 0) return nullptr;  // a tensor this architecture lacks (Llama's wpe, ln_f/bias)
  void* base = at.unit == m.layout.root_unit ? m.root : m.head;
  return tensor_at(base, m.layout.units[at.unit], at.index, dtype_size(m.dt));
}
float* root_grad(const GPT& m, int i) {
  const RootSlot at = m.layout.root_at[i];
  if (at.unit < 0) return nullptr;
  float* base = at.unit == m.layout.root_unit ? m.root_grad : m.head_grad;
  return base + m.layout.units[at.unit].tensors[at.index].offset;
}
// The block's normalisations: LayerNorm (GPT-2; mean and rstd saved) or RMSNorm (Llama; rstd).
void norm_forward(const GPT& m, void* out, float* mean, float* rstd, const void* inp,
                  const void* weight, const void* bias, int N, ops::Stream s) {
  if (m.layout.llama)
    ops::rmsnorm_forward(out, rstd, inp, weight, N, m.layout.C, m.layout.norm_eps, m.dt, s);
  else
    ops::layernorm_forward(out, mean, rstd, inp, weight, bias, N, m.layout.C, m.dt, s);
}
void norm_backward(const GPT& m, void* dinp, float* dweight, float* dbias, const void* dout,
                   const void* inp, const void* weight, const float* mean, const float* rstd,
                   int N, ops::Stream s) {
  if (m.layout.llama)
    ops::rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, N, m.layout.C, m.dt, s);
  else
    ops::layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, m.layout.C,
                            m.dt, s);
}

// Llama's rotary embedding on the q and k heads of a packed qkv (N tokens of this rank's heads),
// or its backward on their gradients, chunk by chunk: each zigzag chunk (B, T/(2cp)) under
// context parallelism at its global positions, else one chunk (B, T) at positions 0 .. T-1.
void rope_apply(const GPT& m, void* qkv, int B, int T, bool backward, ops::Stream s,
                const int* doc_positions) {
  const GPTLayout& g = m.layout;
  const int chunks = g.cp->size > 1 && !m.kv ? 2 : 1, len = T / chunks;
  CHECK(chunks == 1 || T == m.T, "context parallelism: a micro-batch of %d positions per rank, "
        "the model's positions are for %d", T, m.T);
  const size_t row = (size_t)g.qkv_local() * dtype_size(m.dt);
  for (int k = 0; k < chunks; k++) {
    char* x = (char*)qkv + (size_t)k * B * len * row;
    const int* positions = m.kv          ? m.kv->positions + m.kv->pos  // sampling: from pos
                           : m.positions ? m.positions + k * len
                                         : nullptr;
    int row_stride = 0;  // positions shared by the B sequences
    if (doc_positions && !m.kv) positions = doc_positions + (size_t)k * B * len, row_stride = len;
    if (backward)
      ops::rope_backward(x, m.rope_cos, m.rope_sin, positions, B, len, g.NH_local, g.NKV_local,
                         g.HS, m.dt, s, row_stride);
    else
      ops::rope_forward(x, m.rope_cos, m.rope_sin, positions, B, len, g.NH_local, g.NKV_local,
                        g.HS, m.dt, s, row_stride);
  }
}

// The block GEMMs, as the parallel linears take them (parallel/tensor_parallel.h): in the compute
// dtype, or on FP8 operands with the scales of linear layer `site` (model/fp8.h; BlockLinear in
// model/gpt.h numbers them).
static void fp8_gemm_forward(const LinearGemm& g, void* out, void* pre_gelu, const void* inp,
                             const void* weight, const void* bias, const void* residual, int N,
                             int K, int OC, ops::Stream s) {
  fp8_linear_forward(*(Fp8Context*)g.context, g.site, out, pre_gelu, inp, weight, bias, residual,
                     N, K, OC, s);
}

static void fp8_gemm_backward(const LinearGemm& g, void* dinp, float* dweight, float* dbias,
                              const void* dout, const void* inp, const void* weight,
                              const void* gelu_input, int N, int K, int OC, ops::Stream s,
                              GradPart part) {
  fp8_linear_backward(*(Fp8Context*)g.context, g.site, dinp, dweight, dbias, dout, inp, weight,
                      gelu_input, N, K, OC, s, part);
}

LinearGemm block_gemm(const GPT& m, int site) {
  if (!m.fp8) return compute_dtype_gemm(m.dt);
  return LinearGemm{fp8_gemm_forward, fp8_gemm_backward, m.fp8, site, m.dt};
}

TpBuffers tp_buffers(const GPT& m) { return {m.gathered, m.partial, m.dln_all, m.dln}; }

const void* block_input(const ActivationSlot& sl, int j) {
  return j == 0 ? sl.input : sl.layers[j - 1].r3;
}

// Block l's MLP (a dense block's, or an MoE block's shared experts) on ln2: out = residual +
// MLP(ln2). With write_output = false only fch and its activation (what the backward needs).
static void mlp_forward(GPT& m, LayerActs& a, int l, const BlockWeights& bw, void* out,
                        const void* residual, int B, int T, bool write_output, ops::Stream s) {
  const GPTLayout& g = m.layout;
  const TensorParallel& tp = g.tp;
  const TpBuffers buf = tp_buffers(m);
  const int C = g.C, N = B * T, F = g.mlp_local(l), site = kBlockLinears * l;
  auto gemm = [&](int linear) { return block_gemm(m, site + linear); };
  void* const* w = bw.w;
  if (g.llama) {  // fch = [gate | up], then silu(gate) * up
    column_parallel_forward(tp, gemm(kFcLinear), buf, a.fch, nullptr, a.ln2, w[kFcW], nullptr, N,
                            C, g.mlp_fc_local(l), s);
    ops::swiglu_forward(a.fch_gelu, a.fch, N, F, m.dt, s);
  } else {  // fch, and gelu(fch) from the GEMM's epilogue
    column_parallel_forward(tp, gemm(kFcLinear), buf, a.fch_gelu, a.fch, a.ln2, w[kFcW], w[kFcB],
                            N, C, F, s);
  }
  if (write_output)
    row_parallel_forward(tp, gemm(kFcProjLinear), buf, out, a.fch_gelu, w[kFcProjW],
                         w[kFcProjB], residual, N, F, C, s);
}

// Runs block l, the j-th of its chunk, on the micro-batch in slot sl. With write_output = false
// the last GEMM (r3) is skipped: a block recomputed for its backward needs everything but its
// output, which is already kept. Under tensor parallelism the GEMMs see this rank's heads /
// hidden columns (Cl = C/tp), and the parallel linears move the activations
// (parallel/tensor_parallel.cu).
void block_forward(GPT& m, ActivationSlot& sl, int j, int l, const BlockWeights& bw, int B,
                   int T, bool write_output, float dloss, ops::Stream s) {
  const GPTLayout& g = m.layout;
  const TensorParallel& tp = g.tp;
  const TpBuffers buf = tp_buffers(m);
  const int C = g.C, Cl = C / tp.size(), N = B * T, Nt = tp.tokens(N), site = kBlockLinears * l;
  auto gemm = [&](int linear) { return block_gemm(m, site + linear); };
  const void* x = block_input(sl, j);
  LayerActs& a = sl.layers[j];
  void* const* w = bw.w;
  norm_forward(m, a.ln1, a.ln1_mean, a.ln1_rstd, x, w[kLn1W], w[kLn1B], Nt, s);
  column_parallel_forward(tp, gemm(kQkvLinear), buf, a.qkv, nullptr, a.ln1, w[kQkvW], w[kQkvB],
                          N, C, g.qkv_local(), s);
  if (g.llama) rope_apply(m, a.qkv, B, T, false, s, sl.doc_positions);
  if (m.kv)  // sampling: the new tokens against the cached keys and values
    kv_cache_attention(m, l, a.atty, a.qkv, N, s);
  else  // ring over the cp ranks; block-causal over the documents with [data] document_mask
    cp_attention_forward(*m.cp, a.atty, a.lse, a.qkv, B, T, s, sl.docs);
  row_parallel_forward(tp, gemm(kAttnProjLinear), buf, a.r2, a.atty, w[kAttnProjW],
                       w[kAttnProjB], x, N, Cl, C, s);
  norm_forward(m, a.ln2, a.ln2_mean, a.ln2_rstd, a.r2, w[kLn2W], w[kLn2B], Nt, s);
  if (!g.moe[l]) return mlp_forward(m, a, l, bw, a.r3, a.r2, B, T, write_output, s);
  // An MoE block: the shared experts (a dense MLP, split over tp) into r2 + shared, then the
  // routed experts on this rank's tokens (no tensor-parallel collective) add theirs.
  const void* residual = a.r2;
  if (g.Fs_local > 0) {
    mlp_forward(m, a, l, bw, m.moe->shared_sum, a.r2, B, T, write_output, s);
    residual = m.moe->shared_sum;
  }
  if (write_output)
    moe_forward(m, *a.moe, l, a.r3, a.ln2, residual, w[kRouterW], bw.experts, B, T, dloss, s);
  else
    moe_recompute(m, *a.moe, a.ln2, bw.experts, B, T, s);
}

// The units to prefetch while block j computes: the next fsdp_prefetch blocks of the pass, and
// past its end the next action's first unit, unless that is the current unit itself (a chunk of
// one block whose forward is followed by its backward: nothing to fetch).
void prefetch_ahead(GPT& m, ParamStore& store, const StageCall& c, int j, int step) {
  const GPTLayout& g = m.layout;
  const int first = g.first_block(c.chunk), n = g.blocks(c.chunk);
  const int current = g.block_unit[first + j];
  for (int k = 1; k <= store.fsdp_prefetch; k++) {
    const int i = j + k * step;
    if (i >= 0 && i < n) {
      params_prefetch(store, g.block_unit[first + i]);
      continue;
    }
    if (c.next_unit != current) params_prefetch(store, c.next_unit);
    return;
  }
}

// The chunk's blocks, in order, one unit acquired at a time.
static void chunk_forward(GPT& m, ParamStore& store, const StageCall& c, ops::Stream s) {
  const GPTLayout& g = m.layout;
  const int first = g.first_block(c.chunk), n = g.blocks(c.chunk);
  for (int j = 0; j < n; j++) {
    const int l = first + j;
    const BlockWeights bw = acquire_block(m, store, l, true, false);
    prefetch_ahead(m, store, c, j, +1);
    block_forward(m, m.slots[c.slot], j, l, bw, c.B, c.T, true, c.dloss, s);
    release_block(m, store, l, true, false, false);
  }
}

// Where this rank's tokens of the micro-batch sit in their sequences (the zigzag chunks under
// context parallelism).
TokenPositions token_positions(const GPT& m, const StageCall& c) {
  const GPTLayout& g = m.layout;
  TokenPositions p = cp_positions_of(g.cp->size, g.cp->rank, c.B, c.T * g.cp->size);
  p.per_token = m.slots[c.slot].doc_positions;
  return p;
}

void gpt_stage_forward(GPT& m, ParamStore& store, const StageCall& c, ops::Stream s) {
  const GPTLayout& g = m.layout;
  ActivationSlot& sl = m.slots[c.slot];
  ops::range_push("forward");
  if (g.first_stage(c.chunk))
    tp_embedding_forward(g.tp, sl.input, m.partial, sl.tokens, root_weight(m, kWte),
                         root_weight(m, kWpe),
                         m.kv ? kv_cache_positions(*m.kv, c.T) : token_positions(m, c), g.C,
                         g.vocab_first, g.Vp_local, g.V, m.dt, s);
  chunk_forward(m, store, c, s);
  if (g.last_stage(c.chunk))  // model/gpt_head.cu
    gpt_head(m, sl, gpt_stage_output(m, c.slot, c.chunk), c, s);
  ops::range_pop();
}

void* gpt_stage_output(GPT& m, int slot, int chunk) {
  return m.slots[slot].layers[m.layout.blocks(chunk) - 1].r3;
}

void gpt_step_begin(GPT& m, ParamStore& store, bool training) {
  const GPTLayout& g = m.layout;
  if (g.root_unit >= 0) {
    m.root = params_acquire(store, g.root_unit);
    if (training) m.root_grad = grads_acquire(store, g.root_unit);
  }
  if (g.head_unit >= 0 && g.head_unit != g.root_unit) {  // an untied Llama's head
    m.head = params_acquire(store, g.head_unit);
    if (training) m.head_grad = grads_acquire(store, g.head_unit);
  }
}

void gpt_step_end(GPT& m, ParamStore& store, bool training) {
  const GPTLayout& g = m.layout;
  if (g.root_unit >= 0) {
    if (training) grads_release(store, g.root_unit, true);
    params_release(store, g.root_unit);
  }
  if (g.head_unit >= 0 && g.head_unit != g.root_unit) {
    if (training) grads_release(store, g.head_unit, true);
    params_release(store, g.head_unit);
  }
  m.root = m.head = nullptr;
  m.root_grad = m.head_grad = nullptr;
}

void gpt_upload(GPT& m, int slot, const int* tokens, const int* targets, int B, int T,
                ops::Stream s, const int* docs, const int* doc_positions, bool on_device) {
  CHECK(B <= m.B && T <= m.T, "batch %dx%d exceeds the model's buffers %dx%d", B, T, m.B, m.T);
  ActivationSlot& sl = m.slots[slot];
  auto up = [&](void* dst, const int* src, size_t count) {
    if (on_device) ops::copy_on_device(dst, src, count * sizeof(int), s);
    else ops::copy_to_device_async(dst, src, count * sizeof(int), s);
  };
  if (tokens) up(sl.tokens, tokens, (size_t)B * T);
  if (targets) up(m.targets, targets, (size_t)B * T);
  if (ops::is_dry(s)) return;  // the planner's step: nothing is copied or read
  CHECK(!m.document_mask || docs, "document_mask: a micro-batch came without its document ids");
  if (sl.docs) up(sl.docs, docs, (size_t)B * T * m.layout.cp->size);
  if (sl.doc_positions) up(sl.doc_positions, doc_positions, (size_t)B * T);
}
