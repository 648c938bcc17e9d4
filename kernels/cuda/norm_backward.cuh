// kernels/cuda/norm_backward.cuh - what the backward passes of the row norms (layernorm.cu,
// rmsnorm.cu) share: reproducible parameter gradients without float atomics.
//
// A norm's weight (and bias) gradient is a column sum over N rows. Each warp of a backward block
// keeps fp32 accumulators for the whole row width in shared memory (a lane always owns the same
// channels, so accumulating needs no barrier); at the end the block adds its warps in warp order
// and writes one partial row per block and per parameter into the stream's scratch
// (write_block_partials). sum_partials_kernel then adds the per-block partials in a fixed order
// into the fp32 gradients. The number of blocks depends only on N and C, so the result is
// bitwise reproducible.
#pragma once
#include "kernels/cuda/cuda_common.cuh"

namespace ops {
namespace norm {
namespace {  // each including file gets its own copy of the kernel

constexpr int kBackwardMaxWarps = 8;                  // rows in flight per backward block
constexpr int kBackwardMaxBlocks = 256;               // partial rows per parameter
constexpr size_t kBackwardSmemBudget = 96 * 1024;     // per block, to keep 2+ blocks per SM
constexpr size_t kBackwardSmemLimit = 200 * 1024;     // under the 227 KiB opt-in of Hopper
constexpr int kReduceLanes = 8;                       // partial reduction: 32 channels x 8 lanes

// W elements as floats with a streaming load (read once: evicted first).
template <int W, typename T>
__device__ __forceinline__ void load_floats_streaming(float (&f)[W], const T* p) {
  if constexpr (W == 1) {
    f[0] = to_float(__ldcs(p));
  } else {
    Pack128<T> x = load128cs(p);
#pragma unroll
    for (int k = 0; k < W; k++) f[k] = to_float(x[k]);
  }
}

// acc[0..W) += f in shared memory (16-byte accesses when W is a multiple of 4: then acc is
// 16-byte aligned because C is a multiple of W).
template <int W>
__device__ __forceinline__ void add_to_shared(float* acc, const float (&f)[W]) {
  if constexpr (W % 4 == 0) {
#pragma unroll
    for (int k = 0; k < W; k += 4) {
      float4 a = *reinterpret_cast<float4*>(acc + k);
      a.x += f[k];
      a.y += f[k + 1];
      a.z += f[k + 2];
      a.w += f[k + 3];
      *reinterpret_cast<float4*>(acc + k) = a;
    }
  } else {
#pragma unroll
    for (int k = 0; k < W; k++) acc[k] += f[k];
  }
}

// Shared memory holds, per warp w, `params` rows of C accumulators (smem + (w * params + p) * C).
// After a barrier the block writes partials[(p * gridDim.x + blockIdx.x) * C + c], its warps
// added in warp order.
__device__ __forceinline__ void write_block_partials(float* __restrict__ partials,
                                                     const float* smem, int params, int C) {
  __syncthreads();
  const int warps = blockDim.x / 32;
  for (int c = threadIdx.x; c < C; c += blockDim.x)
    for (int p = 0; p < params; p++) {
      float sum = 0.0f;
      for (int w = 0; w < warps; w++) sum += smem[((size_t)w * params + p) * C + c];
      partials[((size_t)p * gridDim.x + blockIdx.x) * C + c] = sum;
    }
}

// grad0[c] += sum_g partials[g][c] and, when grad1 is given, grad1[c] += sum_g partials[G + g][c],
// g in a fixed order: lane y of a 32x8 block sums g = y, y+8, ..., then lane 0 adds the 8 lane
// sums in lane order.
__global__ void sum_partials_kernel(float* __restrict__ grad0, float* __restrict__ grad1,
                                    const float* __restrict__ partials, int G, int C) {
  __shared__ float lane_sum[2][kReduceLanes][32];
  const int c = blockIdx.x * 32 + threadIdx.x;
  float s0 = 0.0f, s1 = 0.0f;
  if (c < C) {
    for (int g = threadIdx.y; g < G; g += kReduceLanes) {
      s0 += partials[(size_t)g * C + c];
      if (grad1) s1 += partials[(size_t)(G + g) * C + c];
    }
  }
  lane_sum[0][threadIdx.y][threadIdx.x] = s0;
  lane_sum[1][threadIdx.y][threadIdx.x] = s1;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float t0 = 0.0f, t1 = 0.0f;
    for (int y = 0; y < kReduceLanes; y++) {
      t0 += lane_sum[0][y][threadIdx.x];
      t1 += lane_sum[1][y][threadIdx.x];
    }
    grad0[c] += t0;
    if (grad1) grad1[c] += t1;
  }
}

// Warps per backward block: as many as the shared-memory budget allows (params * C floats each).
inline int backward_warps(const char* op, int C, int params) {
  const size_t per_warp = (size_t)params * C * sizeof(float);
  CHECK(per_warp <= kBackwardSmemLimit,
        "%s: C=%d needs %zu bytes of shared memory per warp, more than %zu", op, C, per_warp,
        kBackwardSmemLimit);
  size_t warps = kBackwardSmemBudget / per_warp;
  if (warps < 1) warps = 1;
  if (warps > kBackwardMaxWarps) warps = kBackwardMaxWarps;
  return (int)warps;
}

// Adds the per-block partials (G blocks) into grad0 (and grad1) on stream s.
inline void sum_partials(float* grad0, float* grad1, const float* partials, int G, int C,
                         Stream s) {
  dim3 block(32, kReduceLanes);
  sum_partials_kernel<<<(int)ceil_div(C, 32), block, 0, s->stream>>>(grad0, grad1, partials, G,
                                                                     C);
  LAUNCH_CHECK();
}

}  // namespace
}  // namespace norm
}  // namespace ops
