// model/gpt.h - GPT-2: the parameter layout, the activations, forward and backward.
//
// Parameters are grouped into units, the granularity at which FSDP gathers and frees weights and
// at which DDP reduces gradient buckets:
//   unit 0        the root: wte (Vp,C), wpe (maxT,C), ln_f/weight (C), ln_f/bias (C)
//   unit 1 + l    block l: four weight matrices, then eight vectors (LayerNorms and biases)
// Inside a unit the tensors are concatenated into one flat buffer, each starting at a multiple of
// 64 elements (16-byte aligned vector loads in every dtype). The 2-D tensors that get weight
// decay come first, so that a unit is two contiguous ranges: [0, decay_numel) decayed, the rest
// not. Every tensor has a readable, layout-independent name ("h.3/attn/qkv/weight"), which keys
// the random init and names it in checkpoints.
//
// The model code never talks to a communicator: it asks the ParamStore (parallel/param_store.h)
// for a unit's weights and gradient buffer, and the store does what DDP or FSDP needs.
#pragma once
#include <string>
#include <vector>

#include "kernels/ops.h"
#include "model/config.h"

struct ParamStore;

constexpr size_t kTensorAlign = 64;  // elements

struct ParamTensor {
  std::string name;    // "wte", "h.3/attn/qkv/weight", "ln_f/bias", ...
  int64_t rows = 0;    // logical shape (rows, cols); a vector has cols == 1
  int64_t cols = 1;
  size_t offset = 0;   // first element in the unit's flat buffer
  bool decay = false;  // AdamW weight decay applies (2-D weights)
  float init_std = 0;  // > 0: N(0, init_std) for the first init_rows rows
  float init_value = 0;  // otherwise this constant (1 for LayerNorm weights)
  int64_t init_rows = 0;  // rows drawn at random (wte: V; the padded rows start at 0)
  size_t numel() const { return (size_t)(rows * cols); }
};

struct ParamUnit {
  std::vector<ParamTensor> tensors;
  size_t numel = 0;        // flat length, alignment padding included
  size_t decay_numel = 0;  // [0, decay_numel) is weight-decayed
};

// Offsets of the tensors of a block unit, in order (see gpt_layout).
enum BlockTensor {
  kQkvW = 0, kAttnProjW, kFcW, kFcProjW,  // decayed
  kLn1W, kLn1B, kQkvB, kAttnProjB, kLn2W, kLn2B, kFcB, kFcProjB,
  kBlockTensors
};
enum RootTensor { kWte = 0, kWpe, kLnfW, kLnfB, kRootTensors };

struct GPTLayout {
  int L = 0, NH = 0, C = 0, T = 0, V = 0, Vp = 0;
  std::vector<ParamUnit> units;  // 1 + L
  size_t num_parameters() const;  // sum of tensor sizes (llm.c's N: wte counted with Vp rows)
};
GPTLayout gpt_layout(const ModelConfig& m);

enum class Recompute { None, Gelu, Block };
Recompute parse_recompute(const std::string& s);

// Activations of one layer. With recompute, the buffers that are recomputed point into one
// shared set instead of owning per-layer memory.
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
  void* encoded = nullptr;        // (B,T,C) = input of block 0
  void* lnf = nullptr;            // (B,T,C)
  float *lnf_mean = nullptr, *lnf_rstd = nullptr;
  void* logits = nullptr;         // (B,T,Vp), overwritten by dlogits
  float* losses = nullptr;        // (B,T)
  float* loss_sum = nullptr;      // one float: sum over a step of the mean-scaled losses
  int *tokens = nullptr, *targets = nullptr;  // (B,T) on the device
  // backward scratch
  void *dresidual = nullptr, *dln = nullptr, *datty = nullptr, *dqkv = nullptr, *dfch = nullptr;
  std::vector<void*> owned;       // every buffer above, for gpt_destroy
  size_t activation_bytes = 0;    // their total size
};

void gpt_create(GPT& model, const GPTLayout& layout, DType dt, Recompute recompute, int B, int T,
                ops::Stream s);
void gpt_destroy(GPT& model);

// One micro-batch: copies tokens/targets (host, B*T each) to the device, runs forward, and if
// dloss != 0 the backward, accumulating weight gradients through the store. Adds
// dloss_scale_for_log * sum(losses) to model.loss_sum. `last_micro_step` tells the store that
// the gradients of this step are complete after this backward (DDP reduces them then).
void gpt_forward_backward(GPT& model, ParamStore& store, const int* tokens, const int* targets,
                          int B, int T, float dloss, float loss_scale_for_log,
                          bool last_micro_step, ops::Stream s);
// Forward only (validation, sampling): losses in model.losses when targets != nullptr; logits
// of all positions stay in model.logits.
void gpt_forward(GPT& model, ParamStore& store, const int* tokens, const int* targets, int B,
                 int T, ops::Stream s);
