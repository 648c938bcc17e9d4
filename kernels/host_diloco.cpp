// kernels/host_diloco.cpp - DiLoCo's outer arithmetic over host memory (kernels/host_diloco.h):
// elementwise, split over OpenMP threads. Every element is its own chain of fp32 operations in
// the order of kernels/ops_decls.h (x86-64 without -march has no FMA to contract into), so the
// result does not depend on the threads and the CUDA kernels (kernels/cuda/diloco.cu) reproduce
// it bit for bit.
#include "kernels/host_diloco.h"

namespace {

constexpr size_t kParallelMin = 32768;  // below this, one thread is faster than waking the rest

inline void store_weight(float* out, size_t i, float w) { out[i] = w; }
inline void store_weight(uint16_t* out, size_t i, float w) { out[i] = f32_to_bf16(w); }

template <typename T>
void outer_step_typed(float* sync, float* m, float* weights, const float* delta_sum, size_t n,
                      float inv_islands, float lr, float mu, T* out) {
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (size_t i = 0; i < n; i++) {
    const float g = delta_sum[i] * inv_islands;
    const float mi = mu * m[i] + g;
    m[i] = mi;
    const float w = sync[i] - lr * (g + mu * mi);
    sync[i] = w;
    weights[i] = w;
    if (out) store_weight(out, i, w);
  }
}

}  // namespace

void host_diloco_outer_delta(float* delta, const float* sync, const float* weights, size_t n) {
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (size_t i = 0; i < n; i++) delta[i] = sync[i] - weights[i];
}

void host_diloco_outer_step(float* sync, float* m, float* weights, const float* delta_sum,
                            size_t n, float inv_islands, float lr, float mu, void* weights_out,
                            DType out_dt) {
  if (!weights_out || out_dt == DType::F32)
    return outer_step_typed(sync, m, weights, delta_sum, n, inv_islands, lr, mu,
                            (float*)weights_out);
  CHECK(out_dt == DType::BF16, "diloco outer step: weights in %s (fp32 or bf16)",
        dtype_name(out_dt));
  outer_step_typed(sync, m, weights, delta_sum, n, inv_islands, lr, mu, (uint16_t*)weights_out);
}
