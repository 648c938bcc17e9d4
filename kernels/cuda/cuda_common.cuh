// kernels/cuda/cuda_common.cuh - what every CUDA kernel file shares: error macros that name file
// and line, the stream object behind ops::Stream, dtype dispatch, and 16-byte vector access.
#pragma once
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>
#include <vector>

#include "kernels/op_spans.h"
#include "kernels/ops.h"

#define CUDA_CHECK(call)                                                                    \
  do {                                                                                      \
    cudaError_t err_ = (call);                                                              \
    if (err_ != cudaSuccess) fatal_error(__FILE__, __LINE__, "CUDA: %s", cudaGetErrorString(err_)); \
  } while (0)
#define CUBLAS_CHECK(call)                                                                  \
  do {                                                                                      \
    cublasStatus_t st_ = (call);                                                            \
    if (st_ != CUBLAS_STATUS_SUCCESS)                                                       \
      fatal_error(__FILE__, __LINE__, "cuBLAS: status %d", (int)st_);                       \
  } while (0)
// After every launch. Build with -DKERNEL_DEBUG to also synchronise, so that a fault is reported
// at the launch that caused it.
#ifdef KERNEL_DEBUG
#define LAUNCH_CHECK()                          \
  do {                                          \
    CUDA_CHECK(cudaGetLastError());             \
    CUDA_CHECK(cudaDeviceSynchronize());        \
  } while (0)
#else
#define LAUNCH_CHECK() CUDA_CHECK(cudaGetLastError())
#endif

namespace ops {

// A CUDA stream plus the resources that ops launched on it need. One per stream so that two
// streams never share a cuBLASLt workspace or a reduction scratch buffer.
struct StreamImpl {
  cudaStream_t stream = nullptr;
  StreamOptions options;
  cublasLtHandle_t lt = nullptr;
  void* workspace = nullptr;       // cuBLASLt workspace
  size_t workspace_bytes = 0;
  void* scratch = nullptr;         // reductions' partial results; grows on demand
  size_t scratch_bytes = 0;
  std::vector<void*> kept_scratch; // outgrown scratch that a captured CUDA graph may still use
  void* cudnn_plans = nullptr;     // cuDNN handle and attention plans (attention_cudnn.cu)
  void* gemm_signatures = nullptr; // cuBLASLt descriptors and algorithm per GEMM (matmul.cu)
  // What StreamOptions::attention turned into at the first forward and the first backward call
  // (Auto: whichever was faster there), and a line saying so for the log.
  AttentionImpl attention_forward_impl = AttentionImpl::Auto;
  AttentionImpl attention_backward_impl = AttentionImpl::Auto;
  char attention_note[256] = {0};
};
struct EventImpl {
  cudaEvent_t event = nullptr;
};

// Scratch memory of at least `bytes` on stream s, valid until the next call on the same stream.
void* stream_scratch(Stream s, size_t bytes);
// Frees the stream's cached cuBLASLt descriptors (matmul.cu; called by stream_destroy).
void release_gemm_signatures(StreamImpl* s);

}  // namespace ops

// Storage type of a DType, for templates: Storage<DType::BF16>::type is __nv_bfloat16.
__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// Calls fn.template operator()<T>() with T = float or __nv_bfloat16 according to dt:
//   dispatch_dtype(dt, [&](auto tag) { using T = decltype(tag); my_kernel<T><<<...>>>(...); });
template <typename Fn>
inline void dispatch_dtype(DType dt, Fn&& fn) {
  switch (dt) {
    case DType::F32: fn(float{}); return;
    case DType::BF16: fn(__nv_bfloat16{}); return;
    case DType::E4M3:
    case DType::E5M2:  // FP8 is a GEMM operand format, not a compute dtype
    case DType::I8:    // integer payloads of the compressed reductions
    case DType::I32: break;
  }
  FATAL("CUDA backend: no kernels for dtype %d", (int)dt);
}

// 16 bytes of T, loaded and stored as one int4: 4 floats or 8 bf16.
template <typename T>
struct alignas(16) Pack128 {
  static constexpr int size = 16 / sizeof(T);
  T v[size];
  __device__ __forceinline__ T& operator[](int i) { return v[i]; }
  __device__ __forceinline__ const T& operator[](int i) const { return v[i]; }
};
template <typename T>
__device__ __forceinline__ Pack128<T> load128(const T* p) {
  Pack128<T> r;
  *reinterpret_cast<int4*>(&r) = *reinterpret_cast<const int4*>(p);
  return r;
}
// Streaming load that bypasses L1 and is evicted first (data read once).
template <typename T>
__device__ __forceinline__ Pack128<T> load128cs(const T* p) {
  Pack128<T> r;
  *reinterpret_cast<int4*>(&r) = __ldcs(reinterpret_cast<const int4*>(p));
  return r;
}
template <typename T>
__device__ __forceinline__ void store128(T* p, const Pack128<T>& x) {
  *reinterpret_cast<int4*>(p) = *reinterpret_cast<const int4*>(&x);
}

// W consecutive elements of T as floats, and back: one plain access when W == 1, otherwise W / P
// 16-byte packs (p must then be 16-byte aligned). Kernels template their inner loop on W so
// that one body serves the vector path and the scalar path for awkward sizes.
template <int W, typename T>
__device__ __forceinline__ void load_floats(float (&f)[W], const T* p) {
  if constexpr (W == 1) {
    f[0] = to_float(*p);
  } else {
    constexpr int P = Pack128<T>::size;
    static_assert(W % P == 0, "whole 16-byte packs");
#pragma unroll
    for (int j = 0; j < W / P; j++) {
      Pack128<T> x = load128(p + j * P);
#pragma unroll
      for (int k = 0; k < P; k++) f[j * P + k] = to_float(x[k]);
    }
  }
}
template <int W, typename T>
__device__ __forceinline__ void store_floats(T* p, const float (&f)[W]) {
  if constexpr (W == 1) {
    *p = from_float<T>(f[0]);
  } else {
    constexpr int P = Pack128<T>::size;
    static_assert(W % P == 0, "whole 16-byte packs");
#pragma unroll
    for (int j = 0; j < W / P; j++) {
      Pack128<T> x;
#pragma unroll
      for (int k = 0; k < P; k++) x[k] = from_float<T>(f[j * P + k]);
      store128(p + j * P, x);
    }
  }
}

// GELU, GPT-2's tanh approximation 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3), and
// its derivative, in fp32. Shared by the standalone GELU kernels and the hand-written GEMM
// epilogues. Computed as x sigmoid(2u) = x / (1 + exp(-2u)), the same function as the CPU backend
// (kernels/cpu/cpu_common.h): the textbook form loses the digits of 1 + tanh(u) as x goes negative
// (in fp32 against float64: 1.3e-5 relative error at x = -3, 4.5e-4 at -4, 0.3 at -5, and 0 instead
// of the value from x = -6 on; 6e-7 or better the sigmoid way), which the fp32 contract of 1e-5
// against the CPU does not allow. The exponent is capped at 88 as on the CPU, so that
// exp(-2u) stays finite and the derivative's e * sg never becomes inf * 0.
// Derivative: sg + 2 x sg (1 - sg) du/dx with sg = sigmoid(2u), 1 - sg = e sg.
__device__ __forceinline__ float gelu(float x) {
  const float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);  // sqrt(2/pi) (x + c x^3)
  return x / (1.0f + expf(fminf(-2.0f * u, 88.0f)));
}
__device__ __forceinline__ float gelu_grad(float x) {
  const float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
  const float e = expf(fminf(-2.0f * u, 88.0f));
  const float sg = 1.0f / (1.0f + e);
  const float du = 0.7978845608028654f * (1.0f + 3.0f * 0.044715f * x * x);
  return sg + 2.0f * x * sg * (e * sg) * du;
}

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }
// All of them 16-byte aligned (what a kernel needs before it uses 16-byte vector access).
inline bool aligned16(std::initializer_list<const void*> pointers) {
  for (const void* p : pointers)
    if (!aligned16(p)) return false;
  return true;
}

// How an elementwise grid-stride kernel covers n elements: `packs` groups of `elems` on the
// 16-byte vector path (elements [0, tail)), then [tail, n) one by one; enough blocks of
// `threads` for the larger of the two parts, at most 65536. vectorised = false (a misaligned
// pointer) sends everything down the scalar path.
struct ElementwiseSplit {
  size_t packs, tail;
  int blocks;
};
inline ElementwiseSplit elementwise_split(size_t n, bool vectorised, int threads, int elems) {
  ElementwiseSplit sp;
  sp.packs = vectorised ? n / elems : 0;
  sp.tail = sp.packs * elems;
  const size_t work = sp.packs > n - sp.tail ? sp.packs : n - sp.tail;
  const size_t blocks = (work + threads - 1) / threads;
  sp.blocks = (int)(blocks < 1 ? 1 : blocks > 65536 ? 65536 : blocks);
  return sp;
}

__device__ __forceinline__ float warp_reduce_sum(float x) {
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}
__device__ __forceinline__ float warp_reduce_max(float x) {
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}
