// model/fp8.h - FP8 linear layers ([precision] compute = "fp8"): the four GEMMs of every block
// (qkv, attention projection, fc, fc projection), forward and both backward GEMMs, run with FP8
// operands; everything else (embeddings, LayerNorms, attention, the output layer, the loss)
// stays in bf16, and master weights, gradients and Adam moments stay fp32.
//
// The recipe ("hybrid"): activations and weights in E4M3 (more mantissa), output gradients in
// E5M2 (more range). A tensor x is cast as fp8(x * scale) with a scale (per tensor, or per block:
// below) that maps its largest magnitude near the format's largest finite value, and the GEMM
// multiplies its fp32 sums by both operands' 1/scale:
//
//   forward    y  (N,OC) = [x8 (N,C)  . w8 (OC,C)^T] / (sx sw)          then + bias, GELU, ...
//   input grad dx (N,C)  = [g8 (N,OC) . w8^T (C,OC)^T] / (sg sw)        g = dy in E5M2
//   weight grad dW (OC,C) += [g8^T (OC,N) . x8^T (C,N)^T] / (sg sx)     fp32 accumulation
//
// Hopper's FP8 GEMM takes both operands K-contiguous, so the casts also write transposed copies
// (w8^T, g8^T, x8^T) in the same pass. Bias gradients come from the bf16 dy.
//
// Scaling, [precision] fp8_recipe. Per tensor:
//   "tensorwise" (current scaling, default): amax = max |x| of this tensor now, scale =
//                448 (E4M3) or 57344 (E5M2) / amax / 2^fp8_margin. Two passes over x.
//   "delayed":   scale from the largest amax of the previous fp8_amax_history casts of the
//                same tensor at the same layer (the current one while the history is empty);
//                the current amax then enters the history. The history advances once per cast:
//                once per step for each weight, activation and gradient with grad_accum = 1.
// Per block ("block recipes"): every operand, as the GEMM reads it (rows x K, K contiguous),
// is cut into blocks, and each block gets its own power-of-two scale from its own amax (the
// rules: kernels/fp8.h fp8_block_scale_inv). One outlier then coarsens only its own block:
//
//   "rowwise"   one scale per row (torchtitan's rowwise recipe):
//                 x (N x C)          w (OC x C)
//                 [s0 ---------- ]    [t0 ---------- ]      y[i][j] = s_i t_j sum_k x8 w8
//                 [s1 ---------- ]    [t1 ---------- ]      (an outer product of scales)
//   "blockwise" (DeepSeek-V3) activations and gradients 1 x 128 tiles, weights 128 x 128:
//                 x: [s00 ---|s01 ---|s02 -]    w: +-------+-------+
//                    [s10 ---|s11 ---|s12 -]       |  t00  |  t01  |   128 x 128
//                                                  +-------+-------+
//   "mxfp8"     (OCP Microscaling) one E8M0 scale (a bare power of two) per 1 x 32 run:
//                 x: [e0 -|e1 -|e2 -|e3 -| ... ]     every operand, weights too
//
//   recipe       scale bytes per element    passes over a bf16 operand per cast
//   tensorwise   4 / tensor                 2 (amax, cast) + a 4-byte all-reduce
//   delayed      4 x (history + 3) / tensor 2 (the amax feeds the history) + all-reduce
//   rowwise      4 / K          (K = 768: 0.5%)    2 (row amax, cast)
//   blockwise    4 / 128 (3.1%); weights 4 / 16384  2
//   mxfp8        1 / 32 (3.1%)  (stored here as fp32: 12.5%)  2
//
// Edge blocks are partial (C = 96 gives one 1 x 96 tile): the same scale as zero padding to
// the block size would give, without storing the padding; nothing is refused for its shape.
// Block scales are local: no amax is agreed over ranks (the rows are tokens, local to a
// data-parallel rank, and a reduction over ranks would cost one all-reduce per block). So a
// layout's scales equal one rank's only where its slices cut along block edges: pipeline
// stages always; tensor parallel cuts of K (row-parallel inputs and weights) when C / tp is a
// multiple of the block (128 blockwise, 32 mxfp8; never rowwise, whose row is all of K); and
// data/context parallel ranks hold other tokens, so the weight gradient's operands (blocked
// along the tokens) differ from one rank's. Each is still a correct quantisation of what that
// rank multiplies. Delayed scaling and fp8_amax_history do not apply (scales are current);
// fp8_margin applies to rowwise and blockwise, not to mxfp8 (its rule is the specification's).
// The metrics' "fp8" object (per-tensor amax and scale) is absent for block recipes.
//
// Transposed operands (issue: a rowwise scale of X is a column scale of X^T). The backward's
// GEMMs reduce over other dimensions: dgrad over OC (g as is, w^T), wgrad over the tokens N
// (g^T, x^T). A block recipe casts each of them again from the bf16 tensor, blocked along its
// own K: rowwise scales per row of w^T, g^T and x^T (per column of w, g, x); blockwise 1 x 128
// tiles of g^T and x^T (128 x 1 of g and x), and 128 x 128 blocks of w^T - the transposes of w's
// blocks, so the same scales and codes transposed (computed again, bit for bit the same); mxfp8
// 1 x 32 runs of each transpose. Reusing the forward's codes transposed would apply a row's
// scale along a column, which is exactly what the scale layouts forbid.
//
// The GEMMs of the block recipes run dequantise-in-the-loop (ops::gemm_fp8_blocks): both
// operands decoded to bf16 (exact: power-of-two scales), then the bf16 GEMM with fp32 sums.
// Correct but slower than native scaled FP8 GEMMs (kernels/cuda/fp8.cu says which cuBLASLt
// scale modes would run them natively, and on which GPUs); on the CPU the decoded operands go
// to the fp32 GEMM. So they measure quality, not speed, today.
//
// When to choose which: tensorwise, the cheapest, while no activation outliers set the scale
// (GPT-2-sized models, torchtitan's fastest); delayed saves the amax pass where the fused cast
// matters, at the risk of a stale scale after a spike; rowwise when a few rows (tokens) carry
// outliers; blockwise when outliers sit in a few channels too (DeepSeek-V3 trains this way);
// mxfp8 on Blackwell, whose tensor cores apply its scales for free.
// Saturation: anything beyond the format's range is clipped to its largest finite value, never
// inf. Scales, amaxes and histories stay on the device: no host sync.
//
// Per-tensor recipes: one scale per tensor across the ranks. Before a scale is computed, the amax is reduced (max)
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

// Where the scales live: one per tensor ("tensorwise", "delayed"), one per row ("rowwise"), per
// 1 x 128 tile of activations and gradients and 128 x 128 block of weights ("blockwise"), per
// 1 x 32 run of elements ("mxfp8").
enum class Fp8Granularity { Tensor, Row, Block, Mx };
// The granularity of a [precision] fp8_recipe name (the config schema admits only known names).
Fp8Granularity fp8_granularity(const std::string& recipe);

struct Fp8Recipe {
  Fp8Granularity granularity = Fp8Granularity::Tensor;
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
  // Block recipes only (else null): each FP8 copy's scale_inv per block, row-major over its
  // block grid (ops::fp8_cast_blocks), and the GEMM's dequantisation workspace.
  float *x8_scale = nullptr, *x8t_scale = nullptr, *w8_scale = nullptr, *w8t_scale = nullptr,
        *g8_scale = nullptr, *g8t_scale = nullptr;
  void* dequantized = nullptr;
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
