// test/emu/include/emu_intrinsics.h - the device intrinsics the project's kernels use, for the
// emulated tier (included by emu_cuda.h). Only what the kernels call is here, each with CUDA's
// semantics; a kernel that calls anything else does not compile, which names it.
//
// - Synchronisation: __syncthreads (block barrier) and the warp operations __syncwarp,
//   __shfl_*_sync and __reduce_max_sync are the only points where the scheduler (blocks.cpp)
//   switches between a block's threads. A warp operation completes when every lane of its mask
//   has arrived at the same operation with the same mask; a lane of the mask that has exited, or
//   does not exist, or waits elsewhere, is an error with a message (deadlock, not a hang).
// - Arithmetic: the _rn intrinsics are plain IEEE fp32 operations, round to nearest even. The
//   emulated build compiles with -ffp-contract=off, so `a * b + c` is two roundings here; nvcc
//   contracts it into one fma by default, so such expressions may differ in the last bit from a
//   GPU (the tests compare with tolerances; the intrinsics the kernels use where bits matter are
//   exact). expf, exp2f, logf, tanhf come from the host libm, not CUDA's device libm (which is
//   within 2 ulp): results agree to rounding, not bitwise.
// - Memory: __ldcs is a plain load (cache hints do not change values); atomics are host atomics,
//   since blocks may run on several OS threads at once.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace emu {

// Suspends the calling thread at the block barrier until every thread of its block that has not
// exited is there too.
void syncthreads(const char* file, int line);

// A warp operation in flight. Each lane that reaches the operation fills one (on its own stack)
// and calls warp_sync; the last lane of `mask` to arrive calls `complete` with the calls of all
// lanes (indexed by lane, null outside the mask), which reads every lane's `in` and writes every
// lane's `out`; then all of them continue.
struct WarpCall;
typedef void (*WarpComplete)(WarpCall* const* lanes, unsigned mask);
struct WarpCall {
  WarpComplete complete;
  const char* name;  // for messages: "__shfl_xor_sync", "ldmatrix.sync.aligned.m8n8.x4.shared.b16"
  unsigned mask;
  int src_lane;      // shuffles: the lane whose value this lane receives
  int bytes;         // shuffles: sizeof the value
  const void* in;
  void* out;
  const char* file;
  int line;
};
void warp_sync(WarpCall* call);
void complete_nothing(WarpCall* const* lanes, unsigned mask);
void complete_shuffle(WarpCall* const* lanes, unsigned mask);
void complete_reduce_max_u32(WarpCall* const* lanes, unsigned mask);
void complete_reduce_max_s32(WarpCall* const* lanes, unsigned mask);

inline unsigned lane_id() { return current_thread->lane; }

template <typename T>
inline T shuffle(const char* name, unsigned mask, T var, int src_lane, const char* file, int line) {
  static_assert(sizeof(T) <= 8, "shuffles move at most 8 bytes");
  T out;
  WarpCall call{&complete_shuffle, name, mask, src_lane, (int)sizeof(T), &var, &out, file, line};
  warp_sync(&call);
  return out;
}

// The source lane of a shuffle within segments of `width` lanes (CUDA Programming Guide, warp
// shuffle functions): a lane outside the caller's segment (xor, down) or before it (up) gives
// the caller its own value.
inline int segment_start(int lane, int width) { return lane & ~(width - 1); }

}  // namespace emu

inline void __syncthreads(const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  emu::syncthreads(file, line);
}

inline void __syncwarp(unsigned mask = 0xffffffffu, const char* file = __builtin_FILE(),
                       int line = __builtin_LINE()) {
  emu::WarpCall call{&emu::complete_nothing, "__syncwarp", mask, 0, 0, nullptr, nullptr, file,
                     line};
  emu::warp_sync(&call);
}

template <typename T>
inline T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = 32,
                         const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  const int lane = (int)emu::lane_id();
  int src = lane ^ lane_mask;
  if (src >= emu::segment_start(lane, width) + width) src = lane;
  return emu::shuffle("__shfl_xor_sync", mask, var, src, file, line);
}
template <typename T>
inline T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = 32,
                          const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  const int lane = (int)emu::lane_id();
  int src = lane + (int)delta;
  if (src >= emu::segment_start(lane, width) + width) src = lane;
  return emu::shuffle("__shfl_down_sync", mask, var, src, file, line);
}
template <typename T>
inline T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = 32,
                        const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  const int lane = (int)emu::lane_id();
  int src = lane - (int)delta;
  if (src < emu::segment_start(lane, width)) src = lane;
  return emu::shuffle("__shfl_up_sync", mask, var, src, file, line);
}
template <typename T>
inline T __shfl_sync(unsigned mask, T var, int src_lane, int width = 32,
                     const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  const int lane = (int)emu::lane_id();
  const int src = emu::segment_start(lane, width) + (src_lane & (width - 1));
  return emu::shuffle("__shfl_sync", mask, var, src, file, line);
}

inline unsigned __reduce_max_sync(unsigned mask, unsigned value,
                                  const char* file = __builtin_FILE(),
                                  int line = __builtin_LINE()) {
  unsigned out;
  emu::WarpCall call{&emu::complete_reduce_max_u32, "__reduce_max_sync", mask, 0, 4, &value, &out,
                     file, line};
  emu::warp_sync(&call);
  return out;
}
inline int __reduce_max_sync(unsigned mask, int value, const char* file = __builtin_FILE(),
                             int line = __builtin_LINE()) {
  int out;
  emu::WarpCall call{&emu::complete_reduce_max_s32, "__reduce_max_sync", mask, 0, 4, &value, &out,
                     file, line};
  emu::warp_sync(&call);
  return out;
}

// --- arithmetic ----------------------------------------------------------------------------------
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float rsqrtf(float a) { return 1.0f / std::sqrt(a); }

inline unsigned __float_as_uint(float x) {
  unsigned u;
  std::memcpy(&u, &x, 4);
  return u;
}
inline float __uint_as_float(unsigned u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}
inline int __float_as_int(float x) { return (int)__float_as_uint(x); }
inline float __int_as_float(int i) { return __uint_as_float((unsigned)i); }

// CUDA's integer and float min/max overloads (math_functions.hpp): mixed signed/unsigned
// arguments compare as unsigned.
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline unsigned min(int a, unsigned b) { return min((unsigned)a, b); }
inline unsigned max(int a, unsigned b) { return max((unsigned)a, b); }
inline unsigned min(unsigned a, int b) { return min(a, (unsigned)b); }
inline unsigned max(unsigned a, int b) { return max(a, (unsigned)b); }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline unsigned long long min(unsigned long long a, unsigned long long b) { return a < b ? a : b; }
inline unsigned long long max(unsigned long long a, unsigned long long b) { return a > b ? a : b; }
inline unsigned long min(unsigned long a, unsigned long b) { return a < b ? a : b; }
inline unsigned long max(unsigned long a, unsigned long b) { return a > b ? a : b; }
inline long min(long a, long b) { return a < b ? a : b; }
inline long max(long a, long b) { return a > b ? a : b; }
inline float min(float a, float b) { return std::fmin(a, b); }
inline float max(float a, float b) { return std::fmax(a, b); }

// --- memory --------------------------------------------------------------------------------------
template <typename T>
inline T __ldcs(const T* p) {
  return *p;
}

// The shared-window address of a generic pointer into the block's shared memory (aborts with a
// message if p is not in it, as the PTX ISA leaves that undefined).
namespace emu {
size_t cvta_generic_to_shared(const void* p, const char* file, int line);
}
inline size_t __cvta_generic_to_shared(const void* p, const char* file = __builtin_FILE(),
                                       int line = __builtin_LINE()) {
  return emu::cvta_generic_to_shared(p, file, line);
}

template <typename T>
inline T atomic_max(T* address, T value) {
  T old = __atomic_load_n(address, __ATOMIC_RELAXED);
  while (old < value && !__atomic_compare_exchange_n(address, &old, value, true, __ATOMIC_RELAXED,
                                                     __ATOMIC_RELAXED)) {
  }
  return old;
}
inline unsigned atomicMax(unsigned* address, unsigned value) { return atomic_max(address, value); }
inline int atomicMax(int* address, int value) { return atomic_max(address, value); }
// Integer sums only (the top-k counts of kernels/cuda/grad_compression.cu): any order gives the
// same result, so the two thread orders stay bitwise equal. A float atomicAdd is not provided.
inline unsigned atomicAdd(unsigned* address, unsigned value) {
  return __atomic_fetch_add(address, value, __ATOMIC_RELAXED);
}
inline int atomicAdd(int* address, int value) {
  return __atomic_fetch_add(address, value, __ATOMIC_RELAXED);
}
