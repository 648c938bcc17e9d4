// model/gpt_layout.cu - the GPT's parameters as placed tensors (model/gpt.h, gpt_layout): which
// units a rank holds, which block of each tensor, how each is initialised and reduced.
//
// A dense block is one unit; an MoE block (model/moe.h) is two: its attention, LayerNorms,
// router and shared experts (an MLP of hidden size n_shared_experts * d_expert, split over tp
// like the dense one: "mlp/shared/..."), and its experts, whose gradients are summed over the ranks holding the same experts
// (Axis::EPDP). The root (embeddings, final LayerNorm) is held by the first and the last
// pipeline stage. Every tensor's name keys its random init and its checkpoint dataset.
//
// Llama (layout.llama): no biases, no wpe, RMSNorm weights only, the qkv weight in three unequal
// row sections [q: NH*HS | k: NKV*HS | v: NKV*HS] (grouped-query attention: fewer k and v heads),
// the MLP's fc weight (2F, C) in two sections [gate | up] and its proj (C, F) (Hugging Face's
// down_proj). Each column-parallel section splits over tp alike, so rank r's GEMM output row is
// [its q heads | its k heads | its v heads], resp. [its gate columns | its up columns]: what the
// RoPE, attention and SwiGLU kernels take. An untied head is a unit of its own (lm_head and
// ln_f), held by the last stage only, while the first holds the embedding unit (wte): nothing
// is held twice, nothing is summed over the pair of stages. A tied Llama has GPT-2's one root.
#include <algorithm>
#include <cmath>

#include "model/gpt.h"

// Initialisation and weight decay of a placed tensor.
static TensorPlacement init_normal(TensorPlacement t, float std, int64_t init_rows) {
  t.decay = t.cols > 1;
  t.init_std = std;
  t.init_rows = init_rows;
  return t;
}
static TensorPlacement init_const(TensorPlacement t, float value) {
  t.init_value = value;
  return t;
}

// The root: wte, wpe, ln_f. Order must match RootTensor. How the tensor-parallel ranks split or
// replicate each tensor is parallel/tensor_parallel.h's (tp_*).
static ParamUnit root_unit(const GPTLayout& g) {
  const TensorParallel& tp = g.tp;
  const int64_t C = g.C;
  const float std = 0.02f;
  ParamUnit root;
  add_tensor(root, init_normal(tp_vocabulary_parallel("wte", g.Vp, C, tp), std, g.V));  // pad: 0
  add_tensor(root, init_normal(replicated("wpe", g.maxT, C), std, g.maxT));
  add_tensor(root, init_const(tp_sequence_parallel_replica("ln_f/weight", C, 1, tp), 1));
  add_tensor(root, init_const(tp_sequence_parallel_replica("ln_f/bias", C, 1, tp), 0));
  finish_unit(root);
  root.whole_step = true;
  if (g.cp->size > 1) root.grad_axis = Axis::DPCP;  // every cp rank saw other tokens
  return root;
}

// Llama's root units. Tied: one root {wte, ln_f/weight}, held by the first and the last stage
// as GPT-2's. Untied: the embedding {wte} (first stage) and the head {lm_head, ln_f/weight}
// (last stage).
static ParamUnit llama_embedding_unit(const GPTLayout& g) {
  ParamUnit u;
  add_tensor(u, init_normal(tp_vocabulary_parallel("wte", g.Vp, g.C, g.tp), 0.02f, g.V));
  if (g.tied)
    add_tensor(u, init_const(tp_sequence_parallel_replica("ln_f/weight", g.C, 1, g.tp), 1));
  finish_unit(u);
  u.whole_step = true;
  if (g.cp->size > 1) u.grad_axis = Axis::DPCP;
  return u;
}
static ParamUnit llama_head_unit(const GPTLayout& g) {
  ParamUnit u;
  add_tensor(u, init_normal(tp_vocabulary_parallel("lm_head", g.Vp, g.C, g.tp), 0.02f, g.V));
  add_tensor(u, init_const(tp_sequence_parallel_replica("ln_f/weight", g.C, 1, g.tp), 1));
  finish_unit(u);
  u.whole_step = true;
  if (g.cp->size > 1) u.grad_axis = Axis::DPCP;
  return u;
}

// Llama's block l (the order of block_tensor_order).
static ParamUnit llama_block_unit(const GPTLayout& g, int l) {
  const TensorParallel& tp = g.tp;
  const int64_t C = g.C, HS = g.HS, F = g.F;
  const float std = 0.02f, proj_std = 0.02f / std::sqrt(2.0f * g.L);
  const bool moe = g.moe[l];
  ParamUnit u;
  const std::string h = "h." + std::to_string(l) + "/";
  const std::vector<int64_t> qkv = {g.NH * HS, g.NKV * HS, g.NKV * HS};
  add_tensor(u, init_normal(tp_column_parallel_sections(h + "attn/qkv/weight", qkv, C, tp), std,
                            (g.NH + 2 * g.NKV) * HS));
  add_tensor(u, init_normal(tp_row_parallel_weight(h + "attn/proj/weight", C, g.NH * HS, tp),
                            proj_std, C));
  if (!moe || g.shared_hidden > 0) {  // the dense MLP, or an MoE block's shared experts
    const int64_t H = moe ? g.shared_hidden : F;
    const std::string mlp = h + (moe ? "mlp/shared/" : "mlp/");
    add_tensor(u, init_normal(tp_column_parallel(mlp + "fc/weight", 2 * H, C, 2, tp), std,
                              2 * H));
    add_tensor(u, init_normal(tp_row_parallel_weight(mlp + "proj/weight", C, H, tp), proj_std,
                              C));
  }
  add_tensor(u, init_const(tp_sequence_parallel_replica(h + "ln_1/weight", C, 1, tp), 1));
  add_tensor(u, init_const(tp_sequence_parallel_replica(h + "ln_2/weight", C, 1, tp), 1));
  if (moe) {
    TensorPlacement router =
        init_normal(tp_sequence_parallel_replica(h + "mlp/router/weight", g.E, C, tp), std, g.E);
    router.decay = false;
    add_tensor(u, router);
  }
  finish_unit(u);
  if (g.cp->size > 1) u.grad_axis = Axis::DPCP;
  return u;
}

// Block l: its tensors in unit order, as BlockTensor indices (block_tensor_order says which).
// A dense block has the MLP; an MoE block has the router instead (its experts: expert_unit).
static ParamUnit block_unit(const GPTLayout& g, int l) {
  if (g.llama) return llama_block_unit(g, l);
  const TensorParallel& tp = g.tp;
  const int64_t C = g.C;
  const float std = 0.02f, proj_std = 0.02f / std::sqrt(2.0f * g.L);
  const bool moe = g.moe[l];
  ParamUnit u;
  const std::string h = "h." + std::to_string(l) + "/";
  add_tensor(u, init_normal(tp_column_parallel(h + "attn/qkv/weight", 3 * C, C, 3, tp), std,
                            3 * C));
  add_tensor(u, init_normal(tp_row_parallel_weight(h + "attn/proj/weight", C, C, tp), proj_std, C));
  const bool mlp = !moe || g.shared_hidden > 0;  // the dense MLP, or the shared experts
  const int64_t H = moe ? g.shared_hidden : 4 * C;
  const std::string f = h + (moe ? "mlp/shared/" : "mlp/");
  if (mlp) {
    add_tensor(u, init_normal(tp_column_parallel(f + "fc/weight", H, C, 1, tp), std, H));
    add_tensor(u, init_normal(tp_row_parallel_weight(f + "proj/weight", C, H, tp), proj_std, C));
  }
  add_tensor(u, init_const(tp_column_parallel(h + "attn/qkv/bias", 3 * C, 1, 3, tp), 0));
  if (mlp) add_tensor(u, init_const(tp_column_parallel(f + "fc/bias", H, 1, 1, tp), 0));
  add_tensor(u, init_const(tp_row_parallel_bias(h + "attn/proj/bias", C, tp), 0));
  if (mlp) add_tensor(u, init_const(tp_row_parallel_bias(f + "proj/bias", C, tp), 0));
  add_tensor(u, init_const(tp_sequence_parallel_replica(h + "ln_1/weight", C, 1, tp), 1));
  add_tensor(u, init_const(tp_sequence_parallel_replica(h + "ln_1/bias", C, 1, tp), 0));
  add_tensor(u, init_const(tp_sequence_parallel_replica(h + "ln_2/weight", C, 1, tp), 1));
  add_tensor(u, init_const(tp_sequence_parallel_replica(h + "ln_2/bias", C, 1, tp), 0));
  if (moe) {  // the router sees this rank's tokens (N/tp under SP): partial like the LayerNorms
    TensorPlacement router =
        init_normal(tp_sequence_parallel_replica(h + "mlp/router/weight", g.E, C, tp), std, g.E);
    router.decay = false;  // it must close the unit with the partial tensors (placement.h)
    add_tensor(u, router);
  }
  finish_unit(u);
  if (g.cp->size > 1) u.grad_axis = Axis::DPCP;
  return u;
}

// The order of block l's tensors in its unit, as BlockTensor indices.
const std::vector<int>& block_tensor_order(const GPTLayout& g, int l) {
  static const std::vector<int> dense = {kQkvW, kAttnProjW, kFcW,  kFcProjW, kQkvB, kFcB,
                                         kAttnProjB, kFcProjB, kLn1W, kLn1B, kLn2W, kLn2B};
  static const std::vector<int> moe = {kQkvW, kAttnProjW, kQkvB, kAttnProjB, kLn1W,
                                       kLn1B, kLn2W,      kLn2B, kRouterW};
  static const std::vector<int> llama_dense = {kQkvW, kAttnProjW, kFcW, kFcProjW, kLn1W, kLn2W};
  static const std::vector<int> llama_moe = {kQkvW, kAttnProjW, kLn1W, kLn2W, kRouterW};
  // with shared experts: the dense block's order, then the router
  static const std::vector<int> moe_shared = {kQkvW,  kAttnProjW, kFcW,  kFcProjW, kQkvB,
                                              kFcB,   kAttnProjB, kFcProjB, kLn1W, kLn1B,
                                              kLn2W,  kLn2B,      kRouterW};
  static const std::vector<int> llama_moe_shared = {kQkvW, kAttnProjW, kFcW,  kFcProjW,
                                                    kLn1W, kLn2W,      kRouterW};
  const bool shared = g.shared_hidden > 0;
  if (g.llama) return g.moe[l] ? (shared ? llama_moe_shared : llama_moe) : llama_dense;
  return g.moe[l] ? (shared ? moe_shared : moe) : dense;
}

// The experts of MoE block l held by this expert-parallel rank: E/ep consecutive experts, each
// a whole MLP (replicated over tp: every tp rank runs its own tokens through them). Logically
// the tensors are 3-D, (E, d_expert, C) and so on; a placement stacks the experts' rows, so
// expert e's rows are [e*rows, (e+1)*rows) and this rank holds one range of them. Llama's
// experts are SwiGLU MLPs without biases: fc (E, 2 d_expert, C) holds [gate; up] per expert.
static ParamUnit expert_unit(const GPTLayout& g, int l) {
  const int64_t C = g.C, D = g.d_expert, per = g.E / g.ep->size, first = g.ep->rank * per;
  const float std = 0.02f, proj_std = 0.02f / std::sqrt(2.0f * g.L);
  const std::string h = "h." + std::to_string(l) + "/mlp/experts/";
  auto experts = [&](const char* name, int64_t rows, int64_t cols) {
    // each tp rank runs its own tokens through them: partial gradients under SP, like a LayerNorm
    TensorPlacement t = tp_sequence_parallel_replica(h + name, g.E * rows, cols, g.tp);
    t.row_ranges = {{first * rows, per * rows}};
    t.stacked = g.E;
    return t;
  };
  ParamUnit u;
  const int64_t fc_rows = g.llama ? 2 * D : D;
  add_tensor(u, init_normal(experts("fc/weight", fc_rows, C), std, g.E * fc_rows));
  add_tensor(u, init_normal(experts("proj/weight", C, D), proj_std, g.E * C));
  if (!g.llama) {
    add_tensor(u, init_const(experts("fc/bias", D, 1), 0));
    add_tensor(u, init_const(experts("proj/bias", C, 1), 0));
  }
  finish_unit(u);
  u.grad_axis = Axis::EPDP;  // summed over the ranks that hold the same experts
  return u;
}

static size_t unit_parameters(const ParamUnit& u) {
  size_t n = 0;
  for (const TensorPlacement& t : u.tensors) n += t.numel();
  return n;
}

// Records where the root tensors of unit `u` (at index `at` in g.units) are, by name.
static void note_root_tensors(GPTLayout& g, const ParamUnit& u, int at) {
  static const char* names[kRootTensors] = {"wte", "wpe", "ln_f/weight", "ln_f/bias", "lm_head"};
  for (int r = 0; r < kRootTensors; r++)
    for (size_t i = 0; i < u.tensors.size(); i++)
      if (u.tensors[i].name == names[r]) g.root_at[r] = {at, (int)i};
}

// The root units of this rank, first in g.units, and the global parameter count they start.
// A tied root (GPT-2's, a tied Llama's) is held by the first and the last stage, summed over the
// two (parallel/placement.h: tied). An untied Llama's embedding is the first stage's, its head
// the last stage's. The first stage is pp rank 0's; the last is rank p-1's in the Loop order,
// rank 0's in the V (S stages).
static void add_root_units(GPTLayout& g, int S) {
  const PipelinePlace& pp = g.pp;
  const int last_owner = pipeline_stage_owner(pp.order, pp.p(), S - 1);
  const bool first = pp.rank() == 0, last = pp.rank() == last_owner;
  ParamUnit root = g.llama ? llama_embedding_unit(g) : root_unit(g);
  g.parameters = unit_parameters(root);
  if (g.tied ? first || last : first) {
    root.tied = g.tied && last_owner != 0;
    root.tied_copy = root.tied && !first;
    g.root_unit = (int)g.units.size();
    if (g.tied) g.head_unit = g.root_unit;
    note_root_tensors(g, root, g.root_unit);
    g.units.push_back(root);
  }
  if (g.tied) return;
  ParamUnit head = llama_head_unit(g);
  g.parameters += unit_parameters(head);
  if (!last) return;
  g.head_unit = (int)g.units.size();
  note_root_tensors(g, head, g.head_unit);
  g.units.push_back(head);
}

GPTLayout gpt_layout(const ModelConfig& m, Mesh& mesh) {
  GPTLayout g;
  g.L = m.n_layer;
  g.NH = m.n_head;
  g.C = m.d_model;
  g.T = m.seq_len;
  g.maxT = m.max_seq_len > 0 ? m.max_seq_len : m.seq_len;
  g.V = m.vocab_size;
  g.Vp = m.padded_vocab();
  g.llama = m.is_llama();
  g.tied = !g.llama || m.tie_embeddings;
  g.NKV = m.kv_heads();
  g.HS = m.head_dim();
  g.F = m.ffn_hidden();
  g.norm_eps = (float)m.norm_eps;
  g.rope_theta = m.rope_theta;
  g.tp = TensorParallel{&mesh[Axis::TP], mesh.shape.sp, mesh.shape.tp_overlap};
  g.pp = PipelinePlace{&mesh[Axis::PP], mesh.shape.pp_virtual, mesh.shape.pp_order};
  g.cp = &mesh[Axis::CP];
  const int a2a = mesh.shape.cp_a2a, cp = mesh.shape.cp;
  g.cp_a2a = a2a <= 1 ? nullptr : a2a >= cp ? &mesh[Axis::CP] : &mesh[Axis::CPA2A];
  g.cp_ring = a2a <= 1 ? &mesh[Axis::CP] : &mesh[Axis::CPRing];
  g.ep = &mesh[Axis::EP];
  const TensorParallel& tp = g.tp;
  const PipelinePlace& pp = g.pp;
  g.E = m.n_experts;
  g.top_k = m.n_experts > 0 ? m.top_k : 0;
  g.d_expert = m.expert_hidden();
  g.shared_hidden = m.shared_hidden();
  g.moe.resize(g.L);
  for (int l = 0; l < g.L; l++) g.moe[l] = m.is_moe(l);
  g.NH_local = g.NH / tp.size();
  g.NKV_local = g.NKV / tp.size();
  g.F_local = g.F / tp.size();
  g.Fs_local = g.shared_hidden / tp.size();
  g.Vp_local = g.Vp / tp.size();
  g.vocab_first = tp.rank() * g.Vp_local;
  const int S = pp.p() * pp.v;  // the stages' first blocks: pp_layers, or equal stages
  g.stage_first.assign(1, 0);
  for (int s = 0; s < S; s++)
    g.stage_first.push_back(g.stage_first[s] + (mesh.shape.pp_layers.empty()
                                                    ? g.L / S : mesh.shape.pp_layers[s]));
  CHECK(g.stage_first[S] == g.L, "pipeline: the stages hold %d blocks, the model has %d",
        g.stage_first[S], g.L);
  for (int c = 0; c < pp.v; c++) g.max_blocks = std::max(g.max_blocks, g.blocks(c));

  add_root_units(g, S);
  g.active_parameters = g.parameters;
  g.block_unit.assign(g.L, -1);
  g.expert_unit.assign(g.L, -1);
  for (int l = 0; l < g.L; l++) {
    ParamUnit u = block_unit(g, l);
    g.parameters += unit_parameters(u);
    g.active_parameters += unit_parameters(u);
    ParamUnit experts;
    if (g.moe[l]) {
      experts = expert_unit(g, l);
      g.parameters += unit_parameters(experts);
      g.active_parameters += unit_parameters(experts) / g.E * g.top_k;
    }
    const int stage = (int)(std::upper_bound(g.stage_first.begin(), g.stage_first.end(), l) -
                            g.stage_first.begin()) - 1;
    if (pipeline_stage_owner(pp.order, pp.p(), stage) != pp.rank()) continue;  // elsewhere
    g.block_unit[l] = (int)g.units.size();
    u.paired = g.moe[l];  // used with its experts
    u.stage = experts.stage = stage;
    g.units.push_back(u);
    if (!g.moe[l]) continue;
    g.expert_unit[l] = (int)g.units.size();
    g.units.push_back(experts);
  }
  for (ParamUnit& u : g.units) u.grad_replicas = mesh.shape.dp_replicate;  // parallel/hsdp.cu
  return g;
}

Recompute parse_recompute(const std::string& s) {
  if (s == "gelu") return Recompute::Gelu;
  if (s == "block") return Recompute::Block;
  return Recompute::None;
}
