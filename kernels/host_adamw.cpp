// kernels/host_adamw.cpp - AdamW over host memory (kernels/host_adamw.h), elementwise, in parallel
// over elements (OpenMP threads, each a vectorised run of consecutive elements).
//
// The operation order is PyTorch's (torch.optim.AdamW, foreach=False, see ops.h), in fp32, so the
// result matches it to the last bit or two:
//   p = p * (1 - lr*wd);  m = m*beta1 + (1-beta1)*g;  v = v*beta2 + (1-beta2)*g*g
//   p = p - step_size * (m / (sqrt(v) / sqrt(bc2) + eps)),  step_size = lr / bc1
// The per-step scalars (1 - lr*wd, bias corrections, step size) are computed in double and
// rounded to fp32 once, as PyTorch computes them in Python floats before the fp32 kernel.
// Vectorising changes no result: every element is its own chain of IEEE operations, with no
// reduction to reorder. Both callers run this one compiled loop, so they agree bit for bit.
#include "kernels/host_adamw.h"

#include <cmath>

namespace {

struct AdamWScalars {
  float decay;         // 1 - lr * weight_decay
  float one_minus_b1;  // 1 - beta1
  float one_minus_b2;  // 1 - beta2
  float step_size;     // lr / (1 - beta1^t)
  float bc2_sqrt;      // sqrt(1 - beta2^t)
};

AdamWScalars adamw_scalars(const AdamWStep& st) {
  CHECK(st.t >= 1, "adamw_update: step number %d, expected 1 or more", st.t);
  CHECK(!st.device_grad_scale, "host AdamW: the gradient scale must be on the host (grad_scale)");
  const double bc1 = 1.0 - std::pow((double)st.beta1, st.t);
  const double bc2 = 1.0 - std::pow((double)st.beta2, st.t);
  AdamWScalars k;
  k.decay = (float)(1.0 - (double)st.lr * st.weight_decay);
  k.one_minus_b1 = (float)(1.0 - st.beta1);
  k.one_minus_b2 = (float)(1.0 - st.beta2);
  k.step_size = (float)(st.lr / bc1);
  k.bc2_sqrt = (float)std::sqrt(bc2);
  return k;
}

inline void store_weight(float* out, size_t i, float p) { out[i] = p; }
inline void store_weight(uint16_t* out, size_t i, float p) { out[i] = f32_to_bf16(p); }

constexpr size_t kParallelMin = 32768;  // below this, one thread is faster than waking the rest

template <typename T>
void adamw_typed(float* master, T* param_out, const float* grad, float* m, float* v, size_t n,
                 const AdamWStep& st) {
  const AdamWScalars k = adamw_scalars(st);
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
  for (size_t i = 0; i < n; i++) {
    const float g = grad[i] * st.grad_scale;
    float p = master[i] * k.decay;
    const float mi = m[i] * st.beta1 + k.one_minus_b1 * g;
    const float vi = v[i] * st.beta2 + k.one_minus_b2 * g * g;
    const float denom = std::sqrt(vi) / k.bc2_sqrt + st.eps;
    p = p - k.step_size * (mi / denom);
    m[i] = mi;
    v[i] = vi;
    master[i] = p;
    if (param_out) store_weight(param_out, i, p);
  }
}

}  // namespace

void host_adamw_update(float* master, void* param_out, const float* grad, float* m, float* v,
                       size_t n, const AdamWStep& step, DType param_dt) {
  switch (param_dt) {
    case DType::F32: return adamw_typed(master, (float*)param_out, grad, m, v, n, step);
    case DType::BF16: return adamw_typed(master, (uint16_t*)param_out, grad, m, v, n, step);
    case DType::E4M3:
    case DType::E5M2:
    case DType::I8:
    case DType::I32: break;
  }
  FATAL("adamw_update: weights in %s are not supported (fp32 or bf16)", dtype_name(param_dt));
}
