// kernels/host_diloco.h - DiLoCo's outer arithmetic over host memory, one loop for two callers:
// the CPU backend's ops::diloco_outer_delta/step (kernels/cpu/diloco.cpp) and the outer step of
// shards whose master weights live in host memory under optimizer offload (parallel/diloco.cu,
// in both binaries). One loop, so that an offloaded DiLoCo run on the CPU backend moves its
// weights bit for bit as the plain one does.
#pragma once
#include "kernels/ops.h"

// The formulas of kernels/ops_decls.h (diloco_outer_delta, diloco_outer_step), every product and
// sum rounded once in that order, on n elements. host_diloco_outer_step also writes the new
// weights into weights_out (dtype out_dt: F32 or BF16, rounded to nearest even) when not null.
void host_diloco_outer_delta(float* delta, const float* sync, const float* weights, size_t n);
void host_diloco_outer_step(float* sync, float* m, float* weights, const float* delta_sum,
                            size_t n, float inv_islands, float lr, float mu, void* weights_out,
                            DType out_dt);
