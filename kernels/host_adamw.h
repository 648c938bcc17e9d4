// kernels/host_adamw.h - AdamW over host memory, one loop for two callers: the CPU backend's
// ops::adamw_update (kernels/cpu/adamw.cpp) and the optimizer offload's update of shards that
// live in host memory (parallel/offload.cu, in both binaries). One loop, so that an offloaded
// run on the CPU backend updates its weights bit for bit as the plain one does.
#pragma once
#include "kernels/ops.h"

// The update of ops.h (AdamWStep: PyTorch's order of operations, in fp32) on n elements:
// master, m and v updated in place; param_out (dtype param_dt: F32 or BF16, rounded to nearest
// even), when not null, receives the new weights too. Vectorised and split over OpenMP threads.
// The gradient scale is step.grad_scale: a factor in device memory (device_grad_scale) is the
// caller's to fetch first (the offload copies it down with the gradients).
void host_adamw_update(float* master, void* param_out, const float* grad, float* m, float* v,
                       size_t n, const AdamWStep& step, DType param_dt);
