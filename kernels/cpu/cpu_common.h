// kernels/cpu/cpu_common.h - what the CPU kernels share: the stream and its scratch memory,
// element access for the two storage types, dtype dispatch, exp and the tanh-GELU, and the
// attribute that compiles a hot loop for several instruction sets.
//
// Storage: fp32 tensors are float, bf16 tensors are uint16_t holding the top 16 bits of a float.
// Every kernel reads with load() (exact for both) and stores with store() (bf16: rounded to
// nearest even, once per stored value), computing everything in between in fp32 or wider.
//
// Vectorised hot loops are marked CPU_HOT: GCC then emits an AVX-512, an AVX2+FMA and a baseline
// x86-64 version and picks one at load time (no -march=native, so the binary runs anywhere).
// CPU_HOT also turns off the contraction of a * b + c into an FMA, and the hot loops call fmaf
// where they want one and never reorder a sum, so every version, vectorised or not, rounds
// identically: results do not depend on the machine's instruction set (the baseline version of
// fmaf is slow but exact). OpenMP regions stay outside CPU_HOT functions (the outlined region
// would not be cloned): a parallel loop calls a CPU_HOT kernel on its slice.
//
// Everything lives in namespace ops::cpu so that the GPU test, which compiles this backend with
// -Dops=ref next to the CUDA one, sees no clashing symbols.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>

#include "kernels/op_spans.h"
#include "kernels/ops.h"

#if defined(__x86_64__) && !defined(__clang__)
#define CPU_HOT                                                                \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"), \
                 optimize("fp-contract=off")))
#else
#define CPU_HOT
#endif

// Loops with fewer elements than this run on one thread: a parallel region costs microseconds.
#define CPU_PARALLEL_MIN 32768

namespace ops {

// CPU ops run synchronously on the calling thread; a stream only keeps options and scratch.
struct StreamImpl {
  StreamOptions options;
  // Scratch of the ops on this stream (packed GEMM operands, attention's per-thread rows). It
  // grows to the largest request and is then reused: a fresh large allocation costs a page fault
  // per 4 KiB on first touch, which in a virtual machine can cost more than the GEMM itself.
  std::unique_ptr<float[]> workspace;
  size_t workspace_floats = 0;
};

namespace cpu {

// n floats of scratch for one op: the stream's workspace (valid until the next op on the
// stream), or a buffer of its own when the op was called without a stream (s == nullptr).
class Scratch {
 public:
  Scratch(Stream s, size_t n) {
    if (!s) {
      own_.reset(new float[n]);
      data_ = own_.get();
      return;
    }
    if (s->workspace_floats < n) {
      s->workspace.reset();  // free before allocating: never hold both
      s->workspace.reset(new float[n]);
      s->workspace_floats = n;
    }
    data_ = s->workspace.get();
  }
  float* data() const { return data_; }

 private:
  std::unique_ptr<float[]> own_;
  float* data_ = nullptr;
};

inline float load(const float* p, size_t i) { return p[i]; }
inline float load(const uint16_t* p, size_t i) { return bf16_to_f32(p[i]); }
inline void store(float* p, size_t i, float x) { p[i] = x; }
inline void store(uint16_t* p, size_t i, float x) { p[i] = f32_to_bf16(x); }

// Calls fn(float{}) or fn(uint16_t{}) according to dt, so that a generic lambda can cast its
// void* arguments to the storage type:
//   dispatch_dtype(dt, [&](auto tag) { using T = decltype(tag); kernel((T*)out, ...); });
template <typename Fn>
inline void dispatch_dtype(DType dt, Fn&& fn) {
  switch (dt) {
    case DType::F32: fn(float{}); return;
    case DType::BF16: fn(uint16_t{}); return;
    case DType::E4M3:
    case DType::E5M2:  // FP8 is a GEMM operand format, not a compute dtype
    case DType::I8:    // integer payloads of the compressed reductions
    case DType::I32: break;
  }
  FATAL("CPU backend: no kernels for dtype %d", (int)dt);
}

// n values of storage type T (at src, consecutive) as fp32 into dst.
template <typename T>
inline void load_row(float* dst, const T* src, size_t n) {
  for (size_t i = 0; i < n; i++) dst[i] = load(src, i);
}
template <typename T>
inline void store_row(T* dst, const float* src, size_t n) {
  for (size_t i = 0; i < n; i++) store(dst, i, src[i]);
}

// exp(x) in fp32 without libm, so that loops calling it vectorise: Cephes' expf (x = n ln2 + r,
// degree-5 polynomial in r, times 2^n), within 2 ulp of exp(x). Arguments above 88 give exp(88)
// (no overflow to inf), below -87.3 give 0. Plain arithmetic, so that it rounds the same in
// every CPU_HOT clone (no contraction there) and in baseline code (no FMA there).
inline float exp_fast(float x) {
  const float kMax = 88.0f, kMin = -87.33654f;
  const float kRound = 12582912.0f;  // 1.5 * 2^23: (y + kRound) - kRound rounds y to an integer
  float xc = x > kMax ? kMax : x;
  xc = xc < kMin ? kMin : xc;
  const float n = (xc * 1.44269504088896341f + kRound) - kRound;
  float r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * (r * r) + r + 1.0f;
  const uint32_t scale_bits = (uint32_t)((int32_t)n + 127) << 23;  // 2^n
  float scale;
  std::memcpy(&scale, &scale_bits, 4);
  return x < kMin ? 0.0f : y * scale;
}

// GELU, tanh approximation: 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3). Computed as
// x * sigmoid(2u) = x / (1 + exp(-2u)), the same function without the cancellation of 1 + tanh(u)
// near -1. Its derivative: sg + 2 x sg (1 - sg) du/dx, with sg = sigmoid(2u), 1 - sg = e sg.
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluCubic = 0.044715f;
inline float gelu(float x) {
  const float u = kGeluScale * (x + kGeluCubic * x * x * x);
  return x / (1.0f + exp_fast(-2.0f * u));
}
inline float gelu_grad(float x) {
  const float u = kGeluScale * (x + kGeluCubic * x * x * x);
  const float e = exp_fast(-2.0f * u);
  const float sg = 1.0f / (1.0f + e);
  const float du_dx = kGeluScale * (1.0f + 3.0f * kGeluCubic * x * x);
  return sg + 2.0f * x * sg * (e * sg) * du_dx;
}

}  // namespace cpu
}  // namespace ops
