// kernels/ops.h - the backend seam: everything the model, the parallelisms, the data loader and
// the checkpoints ask of a device, as one flat set of functions.
//
// Two implementations sit behind it, one per binary:
//   ./train_cpu : kernels/cpu/*.cpp   plain C++ and OpenMP in fp32 - the oracle CI runs
//   ./train     : kernels/cuda/*.cu   hand-written kernels, cuBLASLt, flash attention, cuDNN
// The code above the seam is compiled unchanged into both binaries, so the two cannot drift.
//
// Conventions shared by every op:
// - Pointers are device pointers (host memory on the CPU backend).
// - `void*` tensors are stored in the compute dtype `dt` (fp32 or bf16): activations and the
//   working copy of the weights. `float*` tensors are always fp32: weight gradients, master
//   weights, Adam moments, LayerNorm statistics, log-sum-exps, losses. All reductions accumulate
//   in fp32 (or wider) whatever `dt` is.
// - "+=" in a comment means the op accumulates into its output (weight gradients accumulate over
//   micro-batches and over the two uses of the tied embedding); otherwise the output is written.
// - Linear weights are stored (out_features, in_features), row-major, as in llm.c and PyTorch.
// - Every op takes the Stream it runs on; CPU ops run synchronously and ignore it.
// - Shapes: B batch, T sequence, C channels, NH heads, HS head size (C = NH * HS),
//   N = B*T rows, V vocabulary, Vp padded vocabulary (a multiple of 128).
//
// The declarations live in kernels/ops_decls.h, inside `namespace ops`. The GPU test binary links
// both backends at once: it compiles the CPU one with -Dops=ref so that ref::layernorm_forward (the
// oracle) and ops::layernorm_forward (CUDA) can be called side by side.
#pragma once
#include "kernels/common.h"

// encoder_forward/backward's default vocabulary range: every row of wte (no tensor parallelism).
constexpr int kAllVocabRows = 1 << 30;

// Which attention kernel the CUDA backend runs ("auto" = the faster one on this device).
enum class AttentionImpl : int { Auto = 0, Flash = 1, Cudnn = 2 };

// Options fixed when a stream is created; ops launched on the stream obey them.
struct StreamOptions {
  bool allow_tf32 = false;  // fp32 GEMMs may use TF32 tensor cores (never in "fp32" debug runs)
  AttentionImpl attention = AttentionImpl::Auto;
};

struct DeviceInfo {
  char name[256];       // e.g. "NVIDIA H100 80GB HBM3" or "cpu (2 threads)"
  size_t total_memory;  // bytes
  size_t free_memory;   // bytes free at device_init (the host's MemAvailable on the CPU backend)
  int multiprocessors;  // SMs, or CPU threads
};

// One AdamW update, PyTorch's formula (torch.optim.AdamW, foreach=False), with the gradient
// first multiplied by grad_scale (1, or the clipping factor) - or, when device_grad_scale is set,
// by the one float it points to in device memory (the clipping factor as grad_norm_and_clip
// wrote it: the host never waits for the gradient norm). In fp32, in this rounding order
// (both backends follow it, so they agree to the last bit; the per-step scalars are computed in
// double and rounded once, as PyTorch does in Python):
//   g = grad * grad_scale
//   p = p * (1 - lr * weight_decay)
//   m = m * beta1 + (1 - beta1) * g
//   v = v * beta2 + ((1 - beta2) * g) * g
//   p = p - (lr / (1 - beta1^t)) * (m / (sqrt(v) / sqrt(1 - beta2^t) + eps))
struct AdamWStep {
  float lr, beta1, beta2, eps, weight_decay, grad_scale;
  int t;  // 1-based step number, for the bias corrections
  const float* device_grad_scale = nullptr;  // replaces grad_scale when set (device memory)
};

#include "kernels/ops_decls.h"
