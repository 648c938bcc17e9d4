// kernels/cuda/adamw.cu - the fused AdamW update of n fp32 master weights, with an optional
// working copy of the updated weights in the compute dtype (bf16 rounded to nearest even).
//
// Per element, PyTorch's formula (kernels/ops.h, AdamWStep) with the roundings of PyTorch's
// kernels (addcmul: (value * g) * g; addcdiv: step_size * (m / denom)) - the same order as the
// CPU backend (kernels/cpu/adamw.cpp), so that the two backends agree bit for bit:
//   g = grad * grad_scale
//   p = p * (1 - lr * weight_decay)
//   m = beta1 * m + (1 - beta1) * g
//   v = beta2 * v + ((1 - beta2) * g) * g
//   p = p - step_size * (m / (sqrt(v) / sqrt(1 - beta2^t) + eps)),  step_size = lr / (1 - beta1^t)
// The per-step scalars (1 - lr*wd, 1 - beta, step_size, sqrt(1 - beta2^t)) are computed once on
// the host in double and rounded to float. The gradient scale (the clipping factor) may instead
// sit in device memory (AdamWStep::device_grad_scale, written by grad_norm_and_clip): every
// thread reads that one float, so the host never waits for the gradient norm. On the device every operation is written as an
// explicitly rounded intrinsic (__fmul_rn, __fadd_rn, ...): nvcc would otherwise contract a*b + c
// into an FMA, and the result would depend on the compiler rather than on this formula.
//
// Parallelisation: grid-stride over packs of 8 elements (two 16-byte loads for each of master,
// grad, m, v: eight loads in flight per thread); a scalar loop in the same kernel handles the
// last n % 8 elements, or all of them when a pointer is not 16-byte aligned.
#include <algorithm>
#include <cmath>

#include "kernels/cuda/cuda_common.cuh"

namespace ops {
namespace {

constexpr int kThreads = 256;
constexpr int kElems = 8;

struct AdamWScalars {
  float decay;            // 1 - lr * weight_decay
  float beta1, one_minus_beta1;
  float beta2, one_minus_beta2;
  float step_size;        // lr / (1 - beta1^t)
  float bias2_sqrt;       // sqrt(1 - beta2^t)
  float eps, grad_scale;
};

AdamWScalars adamw_scalars(const AdamWStep& st) {
  AdamWScalars k;
  k.decay = (float)(1.0 - (double)st.lr * st.weight_decay);
  k.beta1 = st.beta1;
  k.one_minus_beta1 = (float)(1.0 - st.beta1);
  k.beta2 = st.beta2;
  k.one_minus_beta2 = (float)(1.0 - st.beta2);
  k.step_size = (float)(st.lr / (1.0 - std::pow((double)st.beta1, st.t)));
  k.bias2_sqrt = (float)std::sqrt(1.0 - std::pow((double)st.beta2, st.t));
  k.eps = st.eps;
  k.grad_scale = st.grad_scale;
  return k;
}

// One element of the update, in the order above, without contraction.
__device__ __forceinline__ void adamw_element(float& p, float& m, float& v, float grad,
                                              const AdamWScalars& k) {
  const float g = __fmul_rn(grad, k.grad_scale);
  p = __fmul_rn(p, k.decay);
  m = __fadd_rn(__fmul_rn(k.beta1, m), __fmul_rn(k.one_minus_beta1, g));
  v = __fadd_rn(__fmul_rn(k.beta2, v), __fmul_rn(__fmul_rn(k.one_minus_beta2, g), g));
  const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), k.bias2_sqrt), k.eps);
  p = __fsub_rn(p, __fmul_rn(k.step_size, __fdiv_rn(m, denom)));
}



// P: the type of param_out (ignored when param_out is nullptr).
template <typename P>
__global__ void adamw_kernel(float* __restrict__ master, P* __restrict__ param_out,
                             const float* __restrict__ grad, float* __restrict__ m,
                             float* __restrict__ v, size_t packs, size_t tail, size_t n,
                             AdamWScalars k, const float* __restrict__ device_grad_scale) {
  if (device_grad_scale) k.grad_scale = *device_grad_scale;
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  const size_t tid = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  for (size_t i = tid; i < packs; i += stride) {
    const size_t at = i * kElems;
    float p[kElems], g[kElems], mm[kElems], vv[kElems];
    load_floats<kElems>(p, master + at);
    load_floats<kElems>(g, grad + at);
    load_floats<kElems>(mm, m + at);
    load_floats<kElems>(vv, v + at);
#pragma unroll
    for (int e = 0; e < kElems; e++) adamw_element(p[e], mm[e], vv[e], g[e], k);
    store_floats<kElems>(master + at, p);
    store_floats<kElems>(m + at, mm);
    store_floats<kElems>(v + at, vv);
    if (param_out) store_floats<kElems>(param_out + at, p);
  }
  for (size_t i = tail + tid; i < n; i += stride) {
    float p = master[i], mm = m[i], vv = v[i];
    adamw_element(p, mm, vv, grad[i], k);
    master[i] = p;
    m[i] = mm;
    v[i] = vv;
    if (param_out) param_out[i] = from_float<P>(p);
  }
}

}  // namespace

void adamw_update(float* master, void* param_out, const float* grad, float* m, float* v,
                  size_t n, const AdamWStep& step, DType param_dt, Stream s) {
  OP_SPAN(adamw_update);
  if (is_dry(s)) return;
  if (n == 0) return;
  CHECK(step.t >= 1, "adamw_update: step t=%d must be 1-based", step.t);
  const AdamWScalars k = adamw_scalars(step);
  const bool vec = aligned16({master, grad, m, v, param_out});  // nullptr counts as aligned
  const ElementwiseSplit sp = elementwise_split(n, vec, kThreads, kElems);
  dispatch_dtype(param_dt, [&](auto tag) {
    using P = decltype(tag);
    adamw_kernel<P><<<sp.blocks, kThreads, 0, s->stream>>>(
        master, static_cast<P*>(param_out), grad, m, v, sp.packs, sp.tail, n, k,
        step.device_grad_scale);
    LAUNCH_CHECK();
  });
}

}  // namespace ops
