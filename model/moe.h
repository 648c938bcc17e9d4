// model/moe.h - the mixture-of-experts MLP: router, top-k, experts, combine, and the two router
// losses (load balance, z-loss). model/gpt.cu calls it in place of the dense MLP in MoE blocks;
// the math is at the top of model/moe.cu (the host bookkeeping in model/moe_balance.cu), the
// token movement between ranks in parallel/expert_parallel.cu.
#pragma once
#include <vector>

#include "parallel/expert_parallel.h"
#include "parallel/tensor_parallel.h"

struct GPT;

// One MoE block's activations for one micro-batch in flight (a LayerActs points at it).
struct MoeActs {
  float* logits = nullptr;  // (Nt,E) router logits z, fp32
  float* probs = nullptr;   // (Nt,E) softmax(z)
  float* lse = nullptr;     // (Nt) logsumexp(z)
  float* gate = nullptr;    // (Nt,top_k) the chosen experts' gates
  int* expert = nullptr;    // (Nt,top_k) the chosen experts
  void* x = nullptr;        // (max rows,C) the rows this rank's experts run, expert-major
  void* h = nullptr;        // (max rows,D) their fc outputs, before the GELU (Llama: 2D)
  void* hg = nullptr;       // (max rows,D) after it (shared by all layers under recompute)
  void* y = nullptr;        // (Nt*top_k,C) the experts' outputs, back home, dispatch order
  void* dy = nullptr;       // (max rows,C) split backward: d(experts' outputs), expert-major,
                            // kept by B for W (model/gpt_backward.cu); B also leaves d(h) in h
                            // and d(router logits) in logits
  ExpertRoute route;        // where the pairs went (host plan + device gather indices)
  std::vector<float> balance_grad;  // (Nt,E) d(aux loss)/d(probs), made in the forward (host)
};

// What the layers have seen this step, on this rank (summed over the ranks by the trainer).
struct MoeStepStats {
  std::vector<std::vector<double>> tokens;  // per global layer: pairs routed to each expert
  std::vector<double> dropped;              // per global layer: pairs the capacity dropped
  double aux_loss = 0, z_loss = 0;          // their terms of the loss, this rank's share
};

// The step's MoE statistics over every rank (moe_step_report).
struct MoeLayerReport {
  int layer = 0;
  double min = 0, max = 0, mean = 0;  // (token, slot) pairs routed to an expert, over the experts
  std::vector<double> tokens;         // per expert: the pairs the router chose it for
  double dropped = 0;                 // the fraction of the layer's pairs the capacity dropped
};
struct MoeReport {
  double aux_loss = 0, z_loss = 0;    // the two terms the optimizer saw (coefficients included)
  std::vector<MoeLayerReport> layers; // every MoE layer of the model, in order
};

// The MoE state of a model: the ep group, scratch buffers, the losses' coefficients.
struct MoeState {
  ExpertParallel ep;
  float aux_coef = 0, z_coef = 0;  // [train] moe_aux_loss, moe_z_loss
  ops::RouterScore score = ops::RouterScore::Softmax;  // [model] router_score
  float capacity_factor = 0;       // [train] moe_capacity_factor (0: dropless)
  float bias_rate = 0;             // [train] moe_bias_rate (with moe_balance = "bias")
  // moe_balance = "bias": every layer's balancing biases, (L x E) fp32 (a dense layer's unused),
  // the same on every rank; bias_device is their copy the router reads. Empty / null otherwise.
  std::vector<float> bias;
  float* bias_device = nullptr;
  void* shared_sum = nullptr;      // (Nt,C) shared experts: residual + their output; backward:
                                   // their d(ln2) (model/gpt.cu, gpt_backward.cu)
  int max_rows = 0;                // rows this rank's experts can receive per micro-batch
  // scratch, shared by every layer: N = tokens of a micro-batch on this rank (Nt)
  void* send = nullptr;            // (max rows,C) rows on their way (ep > 1)
  void* recv = nullptr;            // (max rows,C) rows arriving (ep > 1)
  void* expert_out = nullptr;      // (max rows,C) the experts' outputs, expert-major (ep > 1)
  void* d_rows = nullptr;          // (Nt*top_k,C) gradients of the pairs' rows, dispatch order
  void* d_expert = nullptr;        // (max rows,C) the same at the experts (ep > 1)
  void* dh = nullptr;              // (max rows,D) (Llama: 2D, d [gate | up])
  void* dhg = nullptr;             // Llama: (max rows,D) the SwiGLU output's gradient
  float* dgate = nullptr;          // (Nt,top_k)
  float* dprobs = nullptr;         // (Nt,E) the load-balancing gradient, uploaded
  float* dlogits = nullptr;        // (Nt,E)
  void* logits_dt = nullptr;       // (Nt,E) the router GEMM's output/gradient in the compute dtype
  void* d_router_in = nullptr;     // (Nt,C) the router's input gradient
  // Recompute: "gelu" shares the GELU outputs (hg) of every layer; "block" shares all four
  // expert-side buffers (x, h, hg, y), refilled by moe_recompute before each layer's backward.
  MoeActs shared;
  MoeStepStats stats;
  std::vector<MoeActs*> owned_acts;  // every layer's, for moe_destroy
};

// Allocates the MoE state and one MoeActs per MoE layer of each activation slot (through the
// model's allocator, which the planner makes count-only). Called by gpt_create.
void moe_create(GPT& m);
void moe_destroy(GPT& m);
// One MoE layer's activations for one slot (after moe_create; freed by moe_destroy).
MoeActs* moe_new_acts(GPT& m);

// Sums the step's statistics over all ranks (collective over `world`; host values, not counted)
// and resets them for the next step. The token counts are the whole world's; the two losses the
// mean over `islands` DiLoCo islands (each island's optimizer saw its own; 1 without islands).
MoeReport moe_step_report(GPT& m, Comm& world, int islands);

// moe_balance = "bias", after each applied optimizer step, on every rank alike: each MoE layer's
// biases move by bias_rate x sign(mean load - load_e), the loads being the report's token counts
// (the pairs the router chose each expert for, summed over every rank and micro-batch of the
// step: moe_step_report). Uploaded on s. Nothing without bias balancing.
void moe_bias_update(GPT& m, const MoeReport& r, ops::Stream s);
// The biases as a checkpoint keeps them (empty without bias balancing), and back (resume: the
// same L x E, else the job stops naming both sizes; a checkpoint without any starts from zeros).
std::vector<float> moe_bias_state(const GPT& m);
void moe_bias_restore(GPT& m, const std::vector<float>& bias, ops::Stream s);

// The expert weights of MoE block l, from its expert unit (weights or gradients).
struct ExpertWeights {
  void *fc_w, *proj_w, *fc_b, *proj_b;
};

// out (Nt,C) = residual + MoE(inp), inp = ln2 (Nt,C): this rank's tokens of a micro-batch of B
// sequences of T local positions. router_w (E,C). dloss_scale: the scale of one token's loss in
// the step's loss (1 / tokens of the global batch); != 0 means training: the balance gradient is
// prepared and the layer's loss terms and token counts go into the step's stats.
void moe_forward(GPT& m, MoeActs& a, int layer, void* out, const void* inp, const void* residual,
                 const void* router_w, const ExpertWeights& w, int B, int T, float dloss_scale,
                 ops::Stream s);
// recompute = "block": before the layer's backward, refills the expert-side buffers (x, h, hg, y)
// from inp = ln2, recomputed, along the route the forward took (no router, no host sync, no
// counts exchange; with ep > 1 the two all-to-alls of the forward run again). out is not written.
void moe_recompute(GPT& m, MoeActs& a, const void* inp, const ExpertWeights& w, int B, int T,
                   ops::Stream s);
// dinp (Nt,C) = d(MoE)/d(inp) given dout (Nt,C); weight gradients accumulated (fp32) into dw
// (the expert unit's gradients) and d_router_w. part Input (a split backward's B): no weight
// gradient; what moe_weight_pass needs is kept in a (dy, h, logits: see MoeActs).
void moe_backward(GPT& m, MoeActs& a, void* dinp, const void* dout, const void* inp,
                  const void* router_w, float* d_router_w, const ExpertWeights& w,
                  const ExpertWeights& dw, int B, int T, float dloss_scale, GradPart part,
                  ops::Stream s);
// The weight pass W after moe_backward's part Input: the experts' and the router's weight
// gradients into dw and d_router_w (inp = ln2, as in the forward). No communication.
void moe_weight_pass(GPT& m, const MoeActs& a, const void* inp, float* d_router_w,
                     const ExpertWeights& dw, int B, int T, ops::Stream s);
