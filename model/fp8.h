// model/fp8.h - FP8 linear layers ([precision] compute = "fp8"): the four GEMMs of every block
// (qkv, attention projection, fc, fc projection), forward and both backward GEMMs, run with FP8
// operands; everything else (embeddings, LayerNorms, attention, the output layer, the loss)
// stays in bf16, and master weights, gradients and Adam moments stay fp32.
//
// The recipe ("hybrid"): activations and weights in E4M3 (more mantissa), output gradients in
// E5M2 (more range). A tensor x is cast as fp8(x * scale) with a per-tensor scale that maps its
// largest magnitude near the format's largest finite value, and the GEMM multiplies its fp32
// sums by both operands' 1/scale:
//
//   forward    y  (N,OC) = [x8 (N,C)  . w8 (OC,C)^T] / (sx sw)          then + bias, GELU, ...
//   input grad dx (N,C)  = [g8 (N,OC) . w8^T (C,OC)^T] / (sg sw)        g = dy in E5M2
//   weight grad dW (OC,C) += [g8^T (OC,N) . x8^T (C,N)^T] / (sg sx)     fp32 accumulation
//
// Hopper's FP8 GEMM takes both operands K-contiguous, so the casts also write transposed copies
// (w8^T, g8^T, x8^T) in the same pass. Bias gradients come from the bf16 dy.
//
// Scaling, [precision] fp8_recipe:
//   "tensorwise" (current scaling, default): amax = max |x| of this tensor now, scale =
//                448 (E4M3) or 57344 (E5M2) / amax / 2^fp8_margin. Two passes over x.
//   "delayed":   scale from the largest amax of the previous fp8_amax_history casts of the
//                same tensor at the same layer (the current one while the history is empty);
//                the current amax then enters the history. The history advances once per cast:
//                once per step for each weight, activation and gradient with grad_accum = 1.
// Saturation: anything beyond the format's range is clipped to its largest finite value, never
// inf. Scales, amaxes and histories stay on the device: no host sync.
//
// One scale per tensor across the ranks. Before a scale is computed, the amax is reduced (max)
// over the amax group - the stage group, dp x cp x tp: every rank that runs the same layers (one
// pp rank; train.cu passes it). Tensor-parallel ranks hold slices of the weights, of the
// row-parallel inputs and of the column-parallel output gradients, and data- and context-
// parallel ranks hold other tokens, so without the reduction every layout would quantize with
// different scales. With it, every layout casts every element to the same FP8 code, and layouts
// differ only in the order of the fp32 sums. (Sequence-parallel inputs are all-gathered before
// the cast, so they are the same tensor on every tp rank anyway.) The cost: one 4-byte all-reduce
// per cast, four per linear layer and micro-step.
//
// In the backward, weights are cast again with the scale of the forward (the weights do not
// change within a step). The input gets its scale again from its own amax (`input_bwd`): under
// pipeline parallelism other micro-batches' forwards run between a micro-batch's forward and its
// backward, so the forward's last input scale belongs to another tensor, and casting with it
// could saturate. With tensorwise scaling that is the forward's scale of the same tensor, bit for
// bit; with delayed scaling it keeps its own history. A zero-bubble pipeline schedule runs the
// two backward GEMMs apart (matmul_backward's dinp alone, later dweight alone), with other
// micro-batches' input-gradient GEMMs in between; the weight pass then scales the gradient with
// its own state `grad_w`, for the same reason: tensorwise, the same scale bit for bit; delayed,
// a history of the same amaxes, since the weight passes of a chunk run in the order of its
// backwards.
#pragma once
#include <string>
#include <vector>

#include "kernels/allocator.h"
#include "kernels/ops.h"
#include "parallel/comm.h"
#include "parallel/tensor_parallel.h"

struct Fp8Recipe {
  bool delayed = false;
  int history = 16;    // fp8_amax_history
  int margin = 0;      // fp8_margin
  Comm* amax_group = nullptr;
};

// One tensor's scaling state on the device: amax, scale, 1/scale, then the amax history.
struct Fp8Scaling {
  float* state = nullptr;  // 3 + history floats
  float* amax() const { return state; }
  float* scale() const { return state + 1; }
  float* scale_inv() const { return state + 2; }
  float* history() const { return state + 3; }
};

struct Fp8Linear {
  Fp8Scaling input, weight, grad;  // E4M3, E4M3, E5M2
  Fp8Scaling input_bwd;            // E4M3: the input again, for the weight-gradient GEMM
  Fp8Scaling grad_w;               // E5M2: the gradient again, for a weight pass run apart
};

// One FP8 linear call as a test sees it (test/test_fp8_sites.cpp checks every call of a model's
// step against float64): the arguments of fp8_linear_forward or fp8_linear_backward, once before
// the call (the inputs intact, even those the call overwrites) and once after (the outputs).
struct Fp8Call {
  int site = 0;
  bool backward = false, after = false;
  void *out = nullptr, *pre_gelu = nullptr;                      // forward
  const void *inp = nullptr, *weight = nullptr, *bias = nullptr, *residual = nullptr;
  GradPart part = GradPart::Both;                                // backward: which GEMMs run
  void* dinp = nullptr;
  float *dweight = nullptr, *dbias = nullptr;
  const void *dout = nullptr, *gelu_input = nullptr;
  int N = 0, C = 0, OC = 0;
  ops::Stream stream = nullptr;
};
struct Fp8Context;
using Fp8Observer = void (*)(const Fp8Context& f, const Fp8Call& call, void* user);
// The observer of a context nobody watches: does nothing.
void fp8_unobserved(const Fp8Context& f, const Fp8Call& call, void* user);

struct Fp8Context {
  Fp8Recipe recipe;
  // Called before and after every linear call with its arguments. A test injects its own to
  // check each call against float64 (test/test_fp8_sites.cpp); the trainer's does nothing.
  Fp8Observer observer = fp8_unobserved;
  void* observer_user = nullptr;
  std::vector<Fp8Linear> linears;
  std::vector<std::string> names;  // per linear, for the metrics
  // FP8 copies of the operands of the GEMM in flight, and their transposes
  void *x8 = nullptr, *x8t = nullptr, *w8 = nullptr, *w8t = nullptr, *g8 = nullptr,
       *g8t = nullptr;
};

// The state of `names.size()` linear layers whose GEMMs have at most max_rows rows (tokens),
// max_in inputs and max_out outputs, zeroed on s, from `memory` (which owns it; a count-only
// allocator, the planner's, only counts it).
void fp8_create(Fp8Context& f, const Fp8Recipe& recipe, const std::vector<std::string>& names,
                int max_rows, int max_in, int max_out, Allocator& memory, ops::Stream s);

// The FP8 counterparts of ops::matmul_forward / matmul_backward (same arguments and meaning,
// kernels/ops_decls.h), for linear layer `site`. inp, weight, out and dout are bf16.
void fp8_linear_forward(Fp8Context& f, int site, void* out, void* pre_gelu, const void* inp,
                        const void* weight, const void* bias, const void* residual, int N, int C,
                        int OC, ops::Stream s);
// part: which GEMMs run (GradPart::Both, or the input or the weight gradient alone); it decides,
// not the pointers, so that the planner's dry step (no buffers) runs the same amax collectives.
void fp8_linear_backward(Fp8Context& f, int site, void* dinp, float* dweight, float* dbias,
                         const void* dout, const void* inp, const void* weight,
                         const void* gelu_input, int N, int C, int OC, ops::Stream s,
                         GradPart part = GradPart::Both);

// amax and scale of the input, weight and gradient of every linear layer, copied to the host
// (the metrics' "fp8" object). Call when the stream is idle.
struct Fp8Snapshot {
  std::string name;  // "h.0/attn/qkv/input"
  float amax, scale;
};
std::vector<Fp8Snapshot> fp8_snapshot(const Fp8Context& f, const std::vector<int>& sites);
