// model/gpt.h - GPT-2 and Llama ([model] arch): the parameter layout, the activations, forward
// and backward.
//
// Parameters are grouped into units, the granularity at which FSDP gathers and frees weights and
// at which DDP reduces gradient buckets:
//   the root      wte (Vp,C), wpe (maxT,C), ln_f/weight (C), ln_f/bias (C)
//   block l       four weight matrices, two column-parallel biases, then the LayerNorm vectors
//                 and the row-parallel biases
// Llama: no biases, no wpe; the root is the embedding {wte} (first stage) and, untied, the head
// {lm_head, ln_f/weight} is a unit of its own (last stage; layout.head_unit); tied, the root is
// {wte, ln_f/weight}, held by both ends as GPT-2's. layout.root_at says where each root tensor is.
// A rank holds the units of its pipeline stages (one stage: all of them, the root first, then
// the blocks in order; layout.root_unit and layout.block_unit say where each one is). An MoE
// block's experts are a unit of their own, right after it (layout.expert_unit). gpt_layout is
// in model/gpt_layout.cu, the head in model/gpt_head.cu, the backward in model/gpt_backward.cu,
// the rest in model/gpt.cu.
//
// The model runs as stages (parallel/pipeline.cu drives them with a schedule): a chunk of
// consecutive blocks, preceded by the embedding on the first stage and followed by the head and
// the loss on the last. Each micro-batch in flight through a chunk keeps its activations in an
// ActivationSlot; with one stage and one micro-batch at a time that is one slot, as in llm.c.
// Each tensor is placed by parallel/placement.h: its global shape, the block this rank holds
// under tensor parallelism (parallel/tensor_parallel.cu), its offset in the unit's flat buffer
// (a multiple of 64 elements: 16-byte aligned vector loads in every dtype). The order inside a
// unit is the placement map's rule: decayed 2-D tensors first, then the other tp-split tensors,
// then the replicated ones. Every tensor has a readable, layout-independent name
// ("h.3/attn/qkv/weight") that keys the random init and names it in checkpoints.
//
// The model never talks to a communicator about weights: it asks the ParamStore
// (parallel/param_store.h) for a unit's weights and gradient buffer, and the store does what DDP
// or FSDP needs. Activations cross the tensor-parallel group inside the parallel layers of
// parallel/tensor_parallel.h.
#pragma once
#include <string>
#include <vector>

#include "kernels/allocator.h"
#include "kernels/ops.h"
#include "config/config.h"
#include "parallel/mesh.h"
#include "parallel/placement.h"
#include "parallel/tensor_parallel.h"

struct ParamStore;
struct Fp8Context;
struct Fp8Recipe;

// Indices of the tensors of a block unit, in unit order (see gpt_layout).
// A dense block holds all but kRouterW; an MoE block (model/moe.h) holds no dense MLP (kFcW,
// kFcProjW, kFcB, kFcProjB) but the router, and its experts live in a unit of their own. An MoE
// block with shared experts holds them as its MLP (kFcW ... of hidden size shared_hidden).
enum BlockTensor {
  kQkvW = 0, kAttnProjW, kFcW, kFcProjW,  // decayed, split over tp
  kQkvB, kFcB,                            // split over tp (column-parallel biases)
  kAttnProjB, kFcProjB,                   // replicated over tp (row-parallel biases)
  kLn1W, kLn1B, kLn2W, kLn2B,             // replicated; gradients partial over tp under SP
  kRouterW,                               // MoE: replicated, partial under SP, not decayed
  kBlockTensors
};
// The tensors of an MoE block's expert unit, in unit order (replicated over tp).
enum ExpertTensor { kExpertFcW = 0, kExpertProjW, kExpertFcB, kExpertProjB, kExpertTensors };
// The root tensors: GPT-2's wte, wpe, ln_f; Llama's wte, ln_f/weight and, untied, lm_head. Where
// each one lives is layout.root_at (a Llama lacks wpe and ln_f/bias).
enum RootTensor { kWte = 0, kWpe, kLnfW, kLnfB, kLmHead, kRootTensors };
// Where a root tensor is: its unit (an index in layout.units) and its index in that unit.
struct RootSlot {
  int unit = -1, index = -1;
};
// The linear layers of a block; layer l's are numbered kBlockLinears * l + these (FP8 scales).
enum BlockLinear { kQkvLinear = 0, kAttnProjLinear, kFcLinear, kFcProjLinear, kBlockLinears };

// This rank's place in the pipeline: it holds chunks c = 0 .. v-1 of the p*v stages of
// consecutive blocks, chunk c being the stage the order gives (parallel/pipeline_schedule.h:
// c*p + rank in the Loop order).
struct PipelinePlace {
  Comm* group = nullptr;  // the pp group (the mesh's)
  int v = 1;
  StageOrder order = StageOrder::Loop;
  int p() const { return group->size; }
  int rank() const { return group->rank; }
};
struct ContextParallel;
struct KvCache;
struct MoeActs;
struct MoeState;

struct GPTLayout {
  int L = 0, NH = 0, C = 0, T = 0, V = 0, Vp = 0;  // the global model
  // The architecture ([model] arch). Llama: RMSNorm, rotary positions, grouped-query attention
  // with NKV key/value heads, a SwiGLU MLP of hidden size F, no biases, the head untied unless
  // tied. GPT-2: NKV = NH, F = 4C, tied.
  bool llama = false;
  bool tied = true;      // the head's weight is wte
  int NKV = 0, HS = 0, F = 0;
  float norm_eps = 1e-5f;
  double rope_theta = 0;
  // This rank's groups (the mesh's, parallel/mesh.h): tensor-parallel, pipeline, context-
  // parallel (it holds T/cp positions of every sequence) and expert-parallel (it holds experts
  // [rank*E/size, (rank+1)*E/size) of every MoE block).
  TensorParallel tp;
  PipelinePlace pp;
  Comm* cp = nullptr;
  // [parallel] cp_comm (parallel/context_parallel_a2a.cu): the all-to-all group inside cp (null
  // under "ring") and the ring's group (cp under "ring", cp-ring under "hybrid", one rank under
  // "all-to-all")
  Comm* cp_a2a = nullptr;
  Comm* cp_ring = nullptr;
  Comm* ep = nullptr;
  int E = 0, top_k = 0, d_expert = 0;  // mixture of experts (E = 0: dense)
  int shared_hidden = 0;  // an MoE block's shared experts: n_shared_experts * d_expert (0: none)
  std::vector<int> stage_first;  // per stage (model order): its first block; [p*v] = L
  int max_blocks = 0;            // the most blocks of one of this rank's chunks
  int root_unit = -1;            // the unit holding wte (the embedding; GPT-2's whole root), -1
                                 // where none: a middle stage (and the last, untied)
  int head_unit = -1;            // the unit holding ln_f and the head weight: root_unit when
                                 // tied, Llama's own head unit when untied (last stage), or -1
  RootSlot root_at[kRootTensors];  // per RootTensor on this rank; unit -1: absent or elsewhere
  std::vector<int> block_unit;   // per global layer: its index in units, -1 on another stage
  std::vector<int> expert_unit;  // per global layer: its experts' unit; -1: dense or elsewhere
  std::vector<bool> moe;         // per global layer: an MoE block
  size_t parameters = 0;         // global, llm.c's N: wte counted with Vp rows
  size_t active_parameters = 0;  // those one token uses: the dense ones, routers, top_k experts
  int NH_local = 0;              // heads on this rank (NH / tp)
  int NKV_local = 0;             // key/value heads on this rank (NKV / tp)
  int F_local = 0;               // MLP hidden columns on this rank (F / tp)
  int qkv_local() const { return (NH_local + 2 * NKV_local) * HS; }  // packed qkv row width
  int fc_local() const { return llama ? 2 * F_local : F_local; }  // fc GEMM output: [gate | up]
  // Block l's MLP on this rank: a dense block's (F_local), or an MoE block's shared experts'
  // (shared_hidden / tp, model/moe.cu), held in the same tensors (kFcW ...) and buffers (fch).
  int Fs_local = 0;
  bool has_mlp(int l) const { return !moe[l] || Fs_local > 0; }
  int mlp_local(int l) const { return moe[l] ? Fs_local : F_local; }
  int mlp_fc_local(int l) const { return llama ? 2 * mlp_local(l) : mlp_local(l); }
  int mlp_max() const { return F_local > Fs_local ? F_local : Fs_local; }  // buffers' widths
  int fc_max() const { return llama ? 2 * mlp_max() : mlp_max(); }
  int Vp_local = 0;              // vocabulary rows of wte on this rank, from vocab_first
  int vocab_first = 0;
  int maxT = 0;  // rows of wpe ([model] max_seq_len); a run uses the first T (seq_len) of them
                 // (Llama: rows of the RoPE tables)
  std::vector<ParamUnit> units;  // this rank's: [root] [head] + its blocks in layer order

  int stage(int chunk) const { return pipeline_stage(pp.order, pp.p(), pp.rank(), chunk); }
  int first_block(int chunk) const { return stage_first[stage(chunk)]; }
  int blocks(int chunk) const { return stage_first[stage(chunk) + 1] - first_block(chunk); }
  bool first_stage(int chunk) const { return stage(chunk) == 0; }
  bool last_stage(int chunk) const { return stage(chunk) == pp.p() * pp.v - 1; }
  // The unit a chunk's forward (or backward) acquires first: its first (last) block.
  int entry_unit(int chunk, bool forward) const {
    return block_unit[first_block(chunk) + (forward ? 0 : blocks(chunk) - 1)];
  }
};
// The placement of every tensor on the mesh rank `mesh` describes (its groups; any backend: the
// checkpoint index asks for other ranks' layouts over described meshes). The layout points to the
// mesh's groups: the mesh must outlive it.
GPTLayout gpt_layout(const ModelConfig& m, Mesh& mesh);

// The order of block l's tensors in its unit, as BlockTensor indices (dense or MoE block).
const std::vector<int>& block_tensor_order(const GPTLayout& g, int layer);

enum class Recompute { None, Gelu, Block };
Recompute parse_recompute(const std::string& s);

// Activations of one layer. With recompute, the buffers that are recomputed point into one
// shared set instead of owning per-layer memory.
// Under tensor parallelism, the LayerNorm/residual tensors (ln1, r2, ln2, r3) hold the tokens of
// this rank (all N = B*T, or N/tp with sequence parallelism) and the others (qkv, atty, fch,
// fch_gelu) hold all N tokens but only this rank's heads / hidden columns.
// Llama: fch is the fc GEMM's [gate | up] (N, 2F/tp), fch_gelu the SwiGLU output (N, F/tp), and
// the norms are RMSNorms (no mean: ln*_mean are null).
struct LayerActs {
  void *ln1, *qkv, *atty, *r2, *ln2, *fch, *fch_gelu, *r3;  // r3 = block output = next input
  float *ln1_mean, *ln1_rstd, *ln2_mean, *ln2_rstd, *lse;
  MoeActs* moe;  // an MoE block's (model/moe.h): fch and fch_gelu are then unused
};

// One micro-batch in flight through one chunk: what its backward needs.
struct ActivationSlot {
  void* input = nullptr;  // (Nt,C) the chunk's input: the embedding, or received from stage s-1
  void* grad = nullptr;   // (Nt,C) the residual-stream gradient: that of the chunk's output on
                          // entry to the backward (received from stage s+1, or the head's), that
                          // of its input on exit (sent to stage s-1). One of GPT::grads: the
                          // pipeline lends them apart from the slots (parallel/pipeline.h)
  std::vector<LayerActs> layers;  // the chunk's blocks; the last one's r3 is the chunk's output
  int* tokens = nullptr;  // (B,T) on the device (the first stage's embedding backward reads them)
  // [data] document_mask (model/documents.h), on every stage: the document ids of the full rows
  // (B, T*cp), chunk-major, and with document_positions this rank's tokens' positions inside
  // their documents (B,T); else null.
  int* docs = nullptr;
  int* doc_positions = nullptr;
};

// Where the host learns the MoE router's choices (each of `pairs` token slots' expert, 0..E-1)
// before it plans the dispatch (model/moe.cu): the trainer reads them back from the device
// (moe_route_from_device: the step's one wait on the host per MoE layer); the planner, whose step
// is dry and has no logits, sets GPT::moe_route_source to the router its plan assumes.
using MoeRouteSource = void (*)(int* expert, const int* device_expert, int pairs, int E,
                                ops::Stream s);
void moe_route_from_device(int* expert, const int* device_expert, int pairs, int E,
                           ops::Stream s);

struct GPT {
  GPTLayout layout;
  DType dt = DType::F32;
  Recompute recompute = Recompute::None;
  int B = 0, T = 0;               // largest micro-batch the buffers hold
  ops::Stream stream = nullptr;   // the stream the buffers were zeroed on
  std::vector<ActivationSlot> slots;
  std::vector<void*> grads;       // the slots' residual-gradient buffers, (Nt,C) each
  int grad_buffers = 0;           // set before gpt_create: how many (pipeline_grad_buffers);
                                  // 0: one per slot
  // Shapes say N = B*T tokens; the residual-stream buffers (slot input and grad, lnf, dln and
  // each layer's ln1, r2, ln2, r3) hold layout.tp.tokens(N) of them.
  // The head (model/gpt_head.cu; on the last stage only): its forward, loss and backward run in
  // one go over chunks of head_chunk tokens, so one set of buffers and no (N,Vp) logits.
  int head_chunk = 0;             // set before gpt_create to force it (tests); 0: N/4
  void* lnf = nullptr;            // (N,C)
  float *lnf_mean = nullptr, *lnf_rstd = nullptr;
  void* logits = nullptr;         // (head_chunk,Vp_local), overwritten by dlogits: in the
                                  // backward's scratch (dead while the head runs)
  float* losses = nullptr;        // (B,T)
  int* targets = nullptr;         // (B,T) on the device
  int logits_row = -1;            // set before a forward pass: the head keeps the logits of this
  void* row_logits = nullptr;     // token row (this rank's Vp_local columns) for gpt_logits_row
  float* ce_stats = nullptr;      // (head_chunk,3) merged (tp > 1)
  float* ce_parts = nullptr;      // (tp,head_chunk,3) every rank's
  void* vocab_row = nullptr;      // (Vp) a row of logits gathered over the vocabulary (sampling)
  // tensor parallelism (tp > 1): every token's LayerNorm output, gathered (N,C); the partial
  // sums of a row-parallel GEMM or of the embedding (N,C)
  void* gathered = nullptr;
  void* partial = nullptr;
  float* loss_sum = nullptr;      // one float: sum over a step of the mean-scaled losses
  // backward scratch. One buffer holds dfch (N,4C/tp), which is dead before datty (N,C/tp) and
  // dqkv (N,3C/tp) are written, so those two share it, and the head's logits, which are dead
  // before any block backward starts. dln_all is `partial` (never live together).
  void *dln = nullptr, *datty = nullptr, *dqkv = nullptr, *dfch = nullptr;
  void* dswiglu = nullptr;        // Llama: (N, F/tp) the SwiGLU output's gradient
  // Llama's rotary positions: cos and sin tables (maxT, HS/2) fp32 (model/rope.h), and under
  // context parallelism this rank's global positions (2 chunks x T/(2cp), int32); else null.
  float *rope_cos = nullptr, *rope_sin = nullptr;
  int* positions = nullptr;
  void* dln_all = nullptr;        // (N,C) a column-parallel GEMM's input gradient, before the sum
  float* ln_grads = nullptr;      // split backward: per layer the LayerNorms' weight gradients
                                  // between B and W, (L, 4, C) fp32 (model/gpt_backward.cu)
  Fp8Context* fp8 = nullptr;      // FP8 block GEMMs ([precision] compute = "fp8"), else null
  ContextParallel* cp = nullptr;  // attention's context-parallel state (one cp rank: empty)
  MoeState* moe = nullptr;        // the MoE layers' state (n_experts > 0), else null
  // The root's weights and gradient buffer, between gpt_step_begin and gpt_step_end; an untied
  // Llama's head unit's likewise (head, head_grad).
  void* root = nullptr;
  float* root_grad = nullptr;
  void* head = nullptr;
  float* head_grad = nullptr;
  // Every buffer above and the FP8, ring-attention and MoE state's: the activation memory
  // (memory.bytes is what the banner and the planner report), freed by gpt_destroy.
  // The planner sets memory.count_only before gpt_create (kernels/allocator.h: every buffer
  // counted, none allocated).
  Allocator memory;
  bool split_backward = false;    // set before gpt_create: the schedule runs each backward as B
                                  // then W (parallel/pipeline_schedule.h): W's buffers too
  float moe_aux_loss = 0;         // set before gpt_create: [train] moe_aux_loss, moe_z_loss
  float moe_z_loss = 0;
  ops::RouterScore moe_router_score = ops::RouterScore::Softmax;  // [model] router_score
  float moe_capacity_factor = 0;  // [train] moe_capacity_factor
  bool moe_bias_balance = false;  // [train] moe_balance = "bias"
  float moe_bias_rate = 0;        // [train] moe_bias_rate
  MoeRouteSource moe_route_source = moe_route_from_device;  // model/moe.h
  KvCache* kv = nullptr;          // set while a sampler's cached forward runs (model/kv_cache.h)
  bool document_mask = false;     // set before gpt_create: [data] document_mask (the slots hold
  bool document_positions = false;  // document ids) and document_positions (and positions)
  int eot_token = 50256;          // [data] eot_token: validation and sampling find documents
};

// T: the positions of a sequence this rank holds (seq_len / cp). fp8: the FP8 recipe of the block
// GEMMs (dt must then be BF16), or nullptr. slots: activation sets, one per micro-batch that can
// be in flight at once on this rank (parallel/pipeline.h). ring: the stream ring attention's
// transfers run on (cp > 1).
void gpt_create(GPT& model, const GPTLayout& layout, DType dt, Recompute recompute, int B, int T,
                ops::Stream s, const Fp8Recipe* fp8 = nullptr, int slots = 1,
                ops::Stream ring = nullptr);
// [precision] compute -> the dtype of activations and working weights (FP8 runs its block GEMMs
// with FP8 operands inside a bf16 model, model/fp8.h).
DType compute_dtype(const PrecisionConfig& p);
// The model a config describes on this layout, as the trainer and the planner make it: the dtype
// of [precision] compute, [train] recompute and the MoE losses, micro_batch x seq_len/cp tokens,
// and with compute = "fp8" the FP8 recipe of [precision] whose amaxes are agreed over amax_group
// (the ranks that run the same layers: the stage group). model.memory as for gpt_create.
void gpt_create_from_config(GPT& model, const GPTLayout& layout, const Config& cfg,
                            Comm* amax_group, int slots, ops::Stream s, ops::Stream ring);
void gpt_destroy(GPT& model);
// A zeroed activation buffer of the model, from model.memory (count-only: counted, nullptr;
// 0 bytes: nullptr). For the model's parts in other files (model/moe.cu).
void* gpt_new_buffer(GPT& model, size_t bytes);

// ---------------------------------------------------------------------------------------------
// Stages. A step (or a forward-only pass) is gpt_step_begin, stage forwards and backwards in the
// schedule's order, gpt_step_end. The root is acquired for the whole step: the first stage's
// embedding and the last stage's head both use it, at both ends of the step.
// ---------------------------------------------------------------------------------------------
void gpt_step_begin(GPT& model, ParamStore& store, bool training);
// Releases the root; when training, its gradients are complete (DDP reduces them, FSDP
// reduce-scatters them: once per step).
void gpt_step_end(GPT& model, ParamStore& store, bool training);
// Copies a micro-batch (host, B*T each) to the device: tokens into the slot (first stage),
// targets for the loss (last stage). Either may be null. With document_mask, on every stage, the
// document ids (B*T*cp) and positions (B*T) of model/documents.h into the slot. on_device: the
// four are device memory (a CUDA graph's step), copied on the device.
void gpt_upload(GPT& model, int slot, const int* tokens, const int* targets, int B, int T,
                ops::Stream s, const int* docs = nullptr, const int* doc_positions = nullptr,
                bool on_device = false);

struct StageCall {
  int chunk = 0, slot = 0, B = 0, T = 0;  // T: this rank's positions per sequence (seq_len/cp)
  float dloss = 0;               // != 0: training (the last stage runs the head's backward too)
  bool with_loss = true;         // the last stage computes the losses (targets uploaded)
  float loss_scale_for_log = 0;  // the last stage adds this * sum(losses) to model.loss_sum
  bool last_micro_step = false;  // backward (weight pass when split): the chunk's last of the
                                 // step, after which its gradients are complete
  int next_unit = -1;            // the unit the schedule's next action acquires first (prefetch)
  GradPart part = GradPart::Both;  // backward: whole, or its input-gradient part B (split)
};
// The chunk's forward: the embedding first on stage 0, then its blocks, and on the last stage the
// final LayerNorm, the logits and the loss; when training, also the head's backward, which leaves
// the gradient of the chunk's output in slot.grad (logits are the largest activation: the last
// stage keeps one set instead of one per micro-batch in flight).
void gpt_stage_forward(GPT& model, ParamStore& store, const StageCall& c, ops::Stream s);
// The chunk's backward (model/gpt_backward.cu): slot.grad holds d(output) on entry and d(input)
// on exit. Whole (c.part Both): the weight gradients too, and on the first stage the embedding's
// backward. c.part Input: the input-gradient pass B of a split schedule.
void gpt_stage_backward(GPT& model, ParamStore& store, const StageCall& c, ops::Stream s);
// The weight-gradient pass W of a split schedule, after the chunk's B on the same slot: every
// weight gradient of the chunk (and on the first stage the embedding's backward).
void gpt_stage_weight(GPT& model, ParamStore& store, const StageCall& c, ops::Stream s);
// The chunk's output activation in a slot (what stage s+1 receives).
void* gpt_stage_output(GPT& model, int slot, int chunk);

// The logits of the token row model.logits_row named before the forward, over the whole
// vocabulary (first V entries, fp32, on the host), gathered from the tensor-parallel ranks. On
// the last stage, after its forward.
std::vector<float> gpt_logits_row(GPT& model, ops::Stream s);
// Whether this rank runs the head: it holds the last pipeline stage.
bool gpt_runs_head(const GPTLayout& layout);
// The head's chunk in tokens for N tokens: `asked` (> 0, at most N), or N/4 (at least 1), so
// that its logits are at most a quarter of a micro-batch's.
int head_chunk_tokens(int N, int asked);
