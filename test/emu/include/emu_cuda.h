// test/emu/include/emu_cuda.h - what nvcc gives device code and g++ does not, for the emulated
// tier (test/emu/README.md). The emulated build force-includes this header (g++ -include) into
// every .cu file it compiles as C++, before the file's own first line.
//
// Types and host API declarations come from the real CUDA headers (cuda_runtime.h, cuda_bf16.h,
// cuda_fp8.h ...), included here first: under g++ they declare everything host code needs and
// define bf16/fp8 conversions in software, bit-exact. What they leave out because it only exists
// for nvcc is defined here and in emu_intrinsics.h:
//   - threadIdx, blockIdx, blockDim, gridDim, warpSize: the state of the emulated thread (a fiber)
//     that is running now, kept in thread-local pointers the scheduler (blocks.cpp) switches;
//   - the kernel launch: test/emu/rewrite.cpp turns `k<<<grid, block, smem, stream>>>(args)` into
//     emu::launch(...), which converts the arguments to the kernel's parameter types as a call
//     would and runs every thread of every block (launch.cpp);
//   - __shared__ memory: the rewriter turns each `__shared__ T x[n];` into a reference to an
//     allocation of exactly sizeof(T[n]) bytes, one per block (emu::static_shared), and each
//     `extern __shared__ T x[];` into a pointer to the launch's dynamic shared memory
//     (emu::dynamic_shared), so that an index out of bounds is an AddressSanitizer error;
//   - __launch_bounds__(n): checked against blockDim at run time (emu::check_launch_bounds).
// Anything else a kernel uses that is not defined here or in emu_intrinsics.h fails to compile
// with its name ("'__ballot_sync' was not declared"); inline PTX fails with a static_assert that
// names the instruction (the rewriter replaces every asm statement of project code).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>

// The project's kernels are compiled with this macro defined: kernels/cuda/attention_ptx.cuh
// selects the emulated PTX wrappers with it (and nothing else may).
#ifndef GPT5D_EMULATED_CUDA
#define GPT5D_EMULATED_CUDA 1
#endif

// Under g++, host_defines.h makes __shared__ an empty macro and leaves __launch_bounds__
// undefined. Both become marker tokens that the rewriter removes: if one survives (the rewriter
// missed it), the compiler stops at an unknown identifier instead of silently giving every thread
// its own "shared" variable.
#undef __shared__
#define __shared__ __emu_shared__
#undef __launch_bounds__
#define __launch_bounds__(...) __emu_launch_bounds__(__VA_ARGS__)

namespace emu {

// The emulated thread that is running on this OS thread, and its block (blocks.cpp sets them
// before switching to a thread's fiber).
struct ThreadState {
  uint3 thread_idx;
  unsigned linear;  // threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)
  unsigned lane;    // linear % 32
  unsigned warp;    // linear / 32
};
struct BlockState {
  uint3 block_idx;
  dim3 block_dim;
  dim3 grid_dim;
};
extern __thread ThreadState* current_thread;
extern __thread BlockState* current_block;

// Where a launch is in the source (after the rewrite: the original file and line).
struct Site {
  const char* file;
  int line;
  const char* kernel;  // the kernel expression as written, e.g. "cast_kernel<D, S>"
  const char* function = nullptr;  // the host function that launches it (EMU_COUNTS names)
};
struct LaunchDims {
  dim3 grid, block;
  size_t smem;
  cudaStream_t stream;
};
inline LaunchDims launch_dims(dim3 grid, dim3 block, size_t smem = 0, cudaStream_t stream = 0) {
  return LaunchDims{grid, block, smem, stream};
}

// The memory a launch can write, for the order check (launch.cpp): when every parameter is a
// number or a pointer to numbers (plain data, no pointers inside), the kernel reaches only the
// allocations those pointers point into; otherwise (a struct, a pointer to pointers) it is
// unknown and the check covers all of device memory.
struct Reach {
  const void* pointers[16];
  int count = 0;
  bool known = true;
};
template <typename T>
constexpr bool plain_element =
    std::is_arithmetic<T>::value || std::is_enum<T>::value || std::is_void<T>::value ||
    std::is_same<T, __nv_bfloat16>::value || std::is_same<T, __nv_bfloat162>::value ||
    std::is_same<T, __half>::value || std::is_same<T, __half2>::value ||
    std::is_same<T, __nv_fp8_e4m3>::value || std::is_same<T, __nv_fp8_e5m2>::value ||
    std::is_same<T, float2>::value || std::is_same<T, float4>::value ||
    std::is_same<T, int2>::value || std::is_same<T, int4>::value ||
    std::is_same<T, uint2>::value || std::is_same<T, uint4>::value;
template <typename P>
void note_argument(Reach& reach, const P& p) {
  if constexpr (std::is_arithmetic<P>::value || std::is_enum<P>::value) {
  } else if constexpr (std::is_pointer<P>::value) {
    using Element = typename std::remove_cv<typename std::remove_pointer<P>::type>::type;
    if (plain_element<Element> && reach.count < 16)
      reach.pointers[reach.count++] = (const void*)p;
    else
      reach.known = false;
  } else {
    reach.known = false;
  }
}

// Checks the launch and queues body(args) on its stream (launch.cpp, streams.cpp): when the
// stream runs it, every thread of every block of the grid runs it. A bad
// configuration does not run and leaves cudaGetLastError() set, as on a GPU. `kernel` identifies
// the kernel for cudaFuncSetAttribute's shared memory opt-in.
typedef void (*ThreadBody)(const void* args);
void run_kernel(const Site& site, const void* kernel, const LaunchDims& dims, ThreadBody body,
                std::shared_ptr<const void> args, const Reach& reach);

// A kernel and its arguments, converted to the parameter types once, at the launch (each thread
// then gets its own copies, as each GPU thread reads the same parameter values).
template <typename... P>
struct KernelCall {
  void (*kernel)(P...);
  std::tuple<P...> args;
  static void run(const void* self) {
    const KernelCall* call = static_cast<const KernelCall*>(self);
    std::apply(call->kernel, call->args);
  }
};

template <typename... P, typename... A>
void launch(const Site& site, const LaunchDims& dims, void (*kernel)(P...), A&&... args) {
  static_assert(sizeof...(P) == sizeof...(A), "kernel launched with the wrong number of arguments");
  auto call = std::make_shared<KernelCall<P...>>(
      KernelCall<P...>{kernel, std::tuple<P...>(std::forward<A>(args)...)});
  Reach reach;
  std::apply([&reach](const auto&... a) { (note_argument(reach, a), ...); }, call->args);
  run_kernel(site, reinterpret_cast<const void*>(kernel), dims, &KernelCall<P...>::run, call,
             reach);
}

// Shared memory of the running block. static_shared: the variable declared at `key` (a static
// object unique to the declaration and template instance), allocated with exactly `bytes` at the
// first call in the block, the same memory for every later call in that block. dynamic_shared:
// the launch's dynamic shared memory (exactly its smem bytes). Both start filled with 0xFF bytes
// (NaN as fp32 and bf16), so that a read before any write shows.
void* static_shared(const void* key, size_t bytes, size_t align, const char* name,
                    const char* file, int line);
void* dynamic_shared(size_t align, const char* name, const char* file, int line);

// __launch_bounds__(max_threads, ...): a GPU refuses a launch with more threads per block.
void check_launch_bounds(long max_threads, const char* file, int line);

}  // namespace emu

#define threadIdx (::emu::current_thread->thread_idx)
#define blockIdx (::emu::current_block->block_idx)
#define blockDim (::emu::current_block->block_dim)
#define gridDim (::emu::current_block->grid_dim)
constexpr int warpSize = 32;

#include "emu_intrinsics.h"
#include "emu_ptx.h"

// NVTX ranges (kernels/cuda/runtime.cu's ops::range_push) go to the emulator's counter, which
// attributes work to the micro-step or the optimizer step by them (test/emu/counts.cpp,
// EMU_COUNTS). The header is included first so that its declarations are not renamed.
#include <nvtx3/nvToolsExt.h>
namespace emu {
void nvtx_range_push(const char* name);
void nvtx_range_pop();
}  // namespace emu
#define nvtxRangePushA(name) (::emu::nvtx_range_push(name), 0)
#define nvtxRangePop() (::emu::nvtx_range_pop(), 0)

// cuda_runtime.h declares this C++ overload only for nvcc (__CUDACC__): a kernel's address as the
// function pointer it is.
template <typename T>
inline cudaError_t cudaFuncSetAttribute(T* entry, cudaFuncAttribute attr, int value) {
  return ::cudaFuncSetAttribute(reinterpret_cast<const void*>(entry), attr, value);
}
