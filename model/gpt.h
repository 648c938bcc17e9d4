// model/gpt.h - GPT-2: the parameter layout, the activations, forward and backward.
//
// Parameters are grouped into units, the granularity at which FSDP gathers and frees weights and
// at which DDP reduces gradient buckets:
//   unit 0        the root: wte (Vp,C), wpe (maxT,C), ln_f/weight (C), ln_f/bias (C)
//   unit 1 + l    block l: four weight matrices, two column-parallel biases, then the
//                 LayerNorm vectors and the row-parallel biases
// Each tensor is placed by parallel/placement.h: its global shape, the block this rank holds
// under tensor parallelism (parallel/tensor_parallel.cu), its offset in the unit's flat buffer
// (a multiple of 64 elements: 16-byte aligned vector loads in every dtype). The order inside a
// unit is the placement map's rule: decayed 2-D tensors first, then the other tp-split tensors,
// then the replicated ones. Every tensor has a readable, layout-independent name
// ("h.3/attn/qkv/weight") that keys the random init and names it in checkpoints.
//
// The model never talks to a communicator about weights: it asks the ParamStore
// (parallel/param_store.h) for a unit's weights and gradient buffer, and the store does what DDP
// or FSDP needs. Activations cross the tensor-parallel group through parallel/tensor_parallel.h.
#pragma once
#include <string>
#include <vector>

#include "kernels/ops.h"
#include "model/config.h"
#include "parallel/placement.h"
#include "parallel/tensor_parallel.h"

struct ParamStore;
struct Fp8Context;
struct Fp8Recipe;

// Indices of the tensors of a block unit, in unit order (see gpt_layout).
enum BlockTensor {
  kQkvW = 0, kAttnProjW, kFcW, kFcProjW,  // decayed, split over tp
  kQkvB, kFcB,                            // split over tp (column-parallel biases)
  kAttnProjB, kFcProjB,                   // replicated over tp (row-parallel biases)
  kLn1W, kLn1B, kLn2W, kLn2B,             // replicated; gradients partial over tp under SP
  kBlockTensors
};
enum RootTensor { kWte = 0, kWpe, kLnfW, kLnfB, kRootTensors };
// The linear layers of a block; layer l's are numbered kBlockLinears * l + these (FP8 scales).
enum BlockLinear { kQkvLinear = 0, kAttnProjLinear, kFcLinear, kFcProjLinear, kBlockLinears };

struct GPTLayout {
  int L = 0, NH = 0, C = 0, T = 0, V = 0, Vp = 0;  // the global model
  TensorParallel tp;             // this rank's place in the tensor-parallel group
  int NH_local = 0;              // heads on this rank (NH / tp)
  int Vp_local = 0;              // vocabulary rows of wte on this rank, from vocab_first
  int vocab_first = 0;
  int maxT = 0;  // rows of wpe ([model] max_seq_len); a run uses the first T (seq_len) of them
  std::vector<ParamUnit> units;  // 1 + L
  size_t num_parameters() const;  // global, llm.c's N: wte counted with Vp rows
};
// The placement of every tensor on tensor-parallel rank tp.rank (tp.comm may be null: the
// checkpoint index asks for other ranks' layouts).
GPTLayout gpt_layout(const ModelConfig& m, const TensorParallel& tp = TensorParallel{});

enum class Recompute { None, Gelu, Block };
Recompute parse_recompute(const std::string& s);

// Activations of one layer. With recompute, the buffers that are recomputed point into one
// shared set instead of owning per-layer memory.
// Under tensor parallelism, the LayerNorm/residual tensors (ln1, r2, ln2, r3) hold the tokens of
// this rank (all N = B*T, or N/tp with sequence parallelism) and the others (qkv, atty, fch,
// fch_gelu) hold all N tokens but only this rank's heads / hidden columns.
struct LayerActs {
  void *ln1, *qkv, *atty, *r2, *ln2, *fch, *fch_gelu, *r3;  // r3 = block output = next input
  float *ln1_mean, *ln1_rstd, *ln2_mean, *ln2_rstd, *lse;
};

struct GPT {
  GPTLayout layout;
  DType dt = DType::F32;
  Recompute recompute = Recompute::None;
  int B = 0, T = 0;               // largest micro-batch the buffers hold
  ops::Stream stream = nullptr;   // the stream the buffers were zeroed on
  std::vector<LayerActs> layers;
  // Shapes say N = B*T tokens; the residual-stream buffers (encoded, lnf, dresidual, dln and
  // each layer's ln1, r2, ln2, r3) hold layout.tp.tokens(N) of them.
  void* encoded = nullptr;        // (N,C) = input of block 0
  void* lnf = nullptr;            // (N,C)
  float *lnf_mean = nullptr, *lnf_rstd = nullptr;
  void* logits = nullptr;         // (N,Vp_local), overwritten by dlogits
  float* losses = nullptr;        // (B,T)
  // tensor parallelism (tp > 1): every token's LayerNorm output, gathered (N,C); the partial
  // sums of a row-parallel GEMM or of the embedding (N,C); the classifier's row statistics
  float* ce_stats = nullptr;      // (N,3) merged
  float* ce_parts = nullptr;      // (tp,N,3) every rank's
  void* gathered = nullptr;
  void* partial = nullptr;
  void* vocab_row = nullptr;      // (Vp) a row of logits gathered over the vocabulary (sampling)
  float* loss_sum = nullptr;      // one float: sum over a step of the mean-scaled losses
  int *tokens = nullptr, *targets = nullptr;  // (B,T) on the device
  // backward scratch
  void *dresidual = nullptr, *dln = nullptr, *datty = nullptr, *dqkv = nullptr, *dfch = nullptr;
  void* dln_all = nullptr;        // (N,C) a column-parallel GEMM's input gradient, before the sum
  Fp8Context* fp8 = nullptr;      // FP8 block GEMMs ([precision] compute = "fp8"), else null
  std::vector<void*> owned;       // every buffer above, for gpt_destroy
  size_t activation_bytes = 0;    // their total size
};

// fp8: the FP8 recipe of the block GEMMs (dt must then be BF16), or nullptr.
void gpt_create(GPT& model, const GPTLayout& layout, DType dt, Recompute recompute, int B, int T,
                ops::Stream s, const Fp8Recipe* fp8 = nullptr);
void gpt_destroy(GPT& model);

// One micro-batch: copies tokens/targets (host, B*T each) to the device, runs the forward and
// the backward of dloss * sum(losses), accumulating weight gradients through the store. Adds
// loss_scale_for_log * sum(losses) to model.loss_sum. `last_micro_step` tells the store that
// the gradients of this step are complete after this backward (DDP reduces them then).
void gpt_forward_backward(GPT& model, ParamStore& store, const int* tokens, const int* targets,
                          int B, int T, float dloss, float loss_scale_for_log,
                          bool last_micro_step, ops::Stream s);
// Forward only (validation, sampling): losses in model.losses when targets != nullptr; logits
// of all positions stay in model.logits (this rank's vocabulary columns).
void gpt_forward(GPT& model, ParamStore& store, const int* tokens, const int* targets, int B,
                 int T, ops::Stream s);
// The logits of row n over the whole vocabulary (first V entries, fp32, on the host), gathered
// from the tensor-parallel ranks. After gpt_forward.
std::vector<float> gpt_logits_row(GPT& model, int n, ops::Stream s);
