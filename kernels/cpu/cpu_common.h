// kernels/cpu/cpu_common.h - what the CPU kernels share: element access for the two storage
// types, dtype dispatch, the tanh-GELU and its derivative, and the attribute that compiles a hot
// loop for several instruction sets.
//
// Storage: fp32 tensors are float, bf16 tensors are uint16_t holding the top 16 bits of a float.
// Every kernel reads with load() (exact for both) and stores with store() (bf16: rounded to
// nearest even, once per stored value), computing everything in between in fp32 or wider.
//
// Vectorised hot loops are marked CPU_HOT: GCC then emits an AVX-512, an AVX2+FMA and a baseline
// x86-64 version and picks one at load time (no -march=native, so the binary runs anywhere). The
// hot loops call fmaf explicitly and never reorder a sum, so every version, vectorised or not,
// rounds identically: results do not depend on the machine's instruction set (the baseline
// version is slow but exact).
//
// Everything lives in namespace ops::cpu so that the GPU test, which compiles this backend with
// -Dops=ref next to the CUDA one, sees no clashing symbols.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>

#include "kernels/ops.h"

#if defined(__x86_64__) && !defined(__clang__)
#define CPU_HOT __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
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
  if (dt == DType::F32) fn(float{});
  else fn(uint16_t{});
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

// GELU, tanh approximation, and its derivative, in fp32.
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluCubic = 0.044715f;
inline float gelu(float x) {
  float u = kGeluScale * (x + kGeluCubic * x * x * x);
  return 0.5f * x * (1.0f + tanhf(u));
}
inline float gelu_grad(float x) {
  float u = kGeluScale * (x + kGeluCubic * x * x * x);
  float t = tanhf(u);
  float sech2 = 1.0f - t * t;
  return 0.5f * (1.0f + t) + 0.5f * x * sech2 * kGeluScale * (1.0f + 3.0f * kGeluCubic * x * x);
}

}  // namespace cpu
}  // namespace ops
