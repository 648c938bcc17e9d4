// test/emu/runtime.cpp - the CUDA runtime API for the emulated tier: the cuda* functions the
// project calls, defined on the host (libcudart is never linked), with CUDA's declarations from
// cuda_runtime_api.h and its error codes.
//
// One device, "sm_90", whose memory is host memory: cudaMalloc returns an exactly-sized,
// 256-byte aligned host allocation filled with 0xFF bytes (so that reading memory nobody wrote
// gives NaN; AddressSanitizer builds then catch any access past its end), and a device pointer is
// a host pointer that the library stand-ins and the kernels use directly.
// Copies and memsets are checked when called and queued on their stream (streams.cpp has the
// streams, events and the schedule that runs their work); allocating and freeing first run every
// stream's queued work, as CUDA's implicit synchronisation orders them.
// Copies check their direction: the device side of a copy must lie inside one live cudaMalloc
// allocation, or the copy fails with cudaErrorInvalidValue and a message saying why.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <memory>
#include <vector>

#include "test/emu/emu_internal.h"
#include "test/emu/include/emu_streams.h"

namespace emu {

namespace {

enum class Memory { Device, PinnedHost };
struct Region {
  size_t bytes;
  Memory kind;
};


struct Runtime {
  std::mutex mutex;
  std::map<char*, Region> memory;
  size_t device_bytes = 0;
  std::map<const void*, int> dynamic_smem_limit;  // cudaFuncAttributeMaxDynamicSharedMemorySize
};
Runtime& runtime() {
  static Runtime* r = new Runtime;  // never destroyed: static destructors may still free memory
  return *r;
}

thread_local cudaError_t last_error = cudaSuccess;

cudaError_t record(cudaError_t err) {
  if (err != cudaSuccess) last_error = err;
  return err;
}

size_t host_memory_bytes() {
  return (size_t)sysconf(_SC_PHYS_PAGES) * (size_t)sysconf(_SC_PAGESIZE);
}

// The region of `kind` holding [p, p + bytes), or null. Caller holds the mutex.
const Region* find_region(const void* p, size_t bytes, Memory kind) {
  Runtime& r = runtime();
  char* c = static_cast<char*>(const_cast<void*>(p));
  auto it = r.memory.upper_bound(c);
  if (it == r.memory.begin()) return nullptr;
  --it;
  if (it->second.kind != kind || c + bytes > it->first + it->second.bytes) return nullptr;
  return &it->second;
}

cudaError_t allocate(void** p, size_t bytes, Memory kind) {
  if (!p) return record(cudaErrorInvalidValue);
  // cudaMalloc returns 256-byte-aligned memory; cudaMallocHost whole pages (it pins pages).
  const size_t alignment = kind == Memory::PinnedHost ? 4096 : 256;
  void* mem = nullptr;
  if (posix_memalign(&mem, alignment, bytes ? bytes : 1) != 0 || !mem)
    return record(cudaErrorMemoryAllocation);
  std::memset(mem, 0xFF, bytes);
  Runtime& r = runtime();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.memory[static_cast<char*>(mem)] = Region{bytes, kind};
  if (kind == Memory::Device) r.device_bytes += bytes;
  *p = mem;
  return cudaSuccess;
}

cudaError_t release(void* p, Memory kind) {
  if (!p) return cudaSuccess;
  Runtime& r = runtime();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.memory.find(static_cast<char*>(p));
  if (it == r.memory.end() || it->second.kind != kind) {
    std::fprintf(stderr, "emu: %s(%p): not a pointer returned by %s\n",
                 kind == Memory::Device ? "cudaFree" : "cudaFreeHost", p,
                 kind == Memory::Device ? "cudaMalloc" : "cudaMallocHost");
    return record(kind == Memory::Device ? cudaErrorInvalidDevicePointer : cudaErrorInvalidValue);
  }
  if (kind == Memory::Device) r.device_bytes -= it->second.bytes;
  r.memory.erase(it);
  std::free(p);
  return cudaSuccess;
}

// Checks the device side(s) of a copy or memset of `bytes` against the live allocations.
cudaError_t check_device_range(const char* what, const void* p, size_t bytes) {
  if (bytes == 0) return cudaSuccess;
  Runtime& r = runtime();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (find_region(p, bytes, Memory::Device)) return cudaSuccess;
  std::fprintf(stderr, "emu: %s: [%p, +%zu bytes) is not inside one cudaMalloc allocation\n", what,
               p, bytes);
  return record(cudaErrorInvalidValue);
}

bool is_pinned(const void* p, size_t bytes) {
  Runtime& r = runtime();
  std::lock_guard<std::mutex> lock(r.mutex);
  return find_region(p, bytes, Memory::PinnedHost) != nullptr;
}

// A copy queued on `stream` (streams.cpp), after its checks. As CUDA does: from pageable host
// memory the source is staged at the call (the host may reuse it at once); to pageable host
// memory, or for a blocking cudaMemcpy, the host waits for the copy.
cudaError_t copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, const char* what,
                 cudaStream_t stream, bool blocking) {
  if (bytes == 0) return cudaSuccess;
  if (!dst || !src) return record(cudaErrorInvalidValue);
  const bool dst_device = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  const bool src_device = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  if (kind != cudaMemcpyHostToHost && kind != cudaMemcpyDefault && !dst_device && !src_device)
    return record(cudaErrorInvalidMemcpyDirection);
  if (dst_device && check_device_range(what, dst, bytes) != cudaSuccess) return last_error;
  if (src_device && check_device_range(what, src, bytes) != cudaSuccess) return last_error;
  if (!valid_stream(stream)) return record(cudaErrorInvalidResourceHandle);
  if (blocking) {
    if (cudaError_t e = capture_refuses_host_wait(stream, true, what)) return e;
  }
  const bool pageable = (!src_device && !is_pinned(src, bytes)) ||
                        (!dst_device && !is_pinned(dst, bytes));
  if (pageable) {
    if (cudaError_t e = capture_refuses_pageable(stream, what)) return e;
  }
  if (!src_device && !is_pinned(src, bytes)) {
    auto staged = std::make_shared<std::vector<char>>(static_cast<const char*>(src),
                                                      static_cast<const char*>(src) + bytes);
    submit(stream, what, [dst, staged] {
      std::memcpy(dst, staged->data(), staged->size());
      return true;
    });
  } else {
    submit(stream, what, [dst, src, bytes] {
      std::memmove(dst, src, bytes);
      return true;
    });
  }
  if (blocking || (!dst_device && !is_pinned(dst, bytes)))
    wait_stream(stream, blocking ? what : "cudaMemcpyAsync to pageable memory");
  return cudaSuccess;
}

}  // namespace

std::vector<Allocation> device_allocations() {
  Runtime& r = runtime();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::vector<Allocation> out;
  for (auto& [base, region] : r.memory) out.push_back({base, region.bytes});
  return out;
}

void set_last_error(cudaError_t err) { record(err); }

int max_dynamic_shared(const void* kernel) {
  Runtime& r = runtime();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.dynamic_smem_limit.find(kernel);
  return it != r.dynamic_smem_limit.end() ? it->second : (int)kStaticSharedLimit;
}

}  // namespace emu

using emu::record;

// --- errors --------------------------------------------------------------------------------------
cudaError_t cudaGetLastError() {
  cudaError_t e = emu::last_error;
  emu::last_error = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError() { return emu::last_error; }

const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevicePointer: return "invalid device pointer";
    case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    default: return "unknown error (emulated runtime)";
  }
}
const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    default: return "cudaErrorUnknown";
  }
}

// --- device --------------------------------------------------------------------------------------
cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
  return device == 0 ? cudaSuccess : record(cudaErrorInvalidDevice);
}
cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (device != 0) return record(cudaErrorInvalidDevice);
  std::memset(prop, 0, sizeof(*prop));
  std::snprintf(prop->name, sizeof(prop->name), "gpt5d CUDA emulator (sm_90, host memory)");
  prop->totalGlobalMem = emu::host_memory_bytes();
  prop->sharedMemPerBlock = emu::kStaticSharedLimit;
  prop->sharedMemPerBlockOptin = emu::kSharedPerBlockLimit;
  prop->sharedMemPerMultiprocessor = 228 * 1024;
  prop->regsPerBlock = 65536;
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = 1024;
  prop->maxThreadsDim[0] = prop->maxThreadsDim[1] = 1024;
  prop->maxThreadsDim[2] = 64;
  prop->maxGridSize[0] = 2147483647;
  prop->maxGridSize[1] = prop->maxGridSize[2] = 65535;
  prop->major = 9;
  prop->minor = 0;
  prop->multiProcessorCount = 132;
  prop->maxThreadsPerMultiProcessor = 2048;
  prop->unifiedAddressing = 1;
  prop->concurrentKernels = 1;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (device != 0) return record(cudaErrorInvalidDevice);
  cudaDeviceProp p;
  cudaGetDeviceProperties(&p, 0);
  switch (attr) {
    case cudaDevAttrMultiProcessorCount: *value = p.multiProcessorCount; break;
    case cudaDevAttrComputeCapabilityMajor: *value = p.major; break;
    case cudaDevAttrComputeCapabilityMinor: *value = p.minor; break;
    case cudaDevAttrMaxThreadsPerBlock: *value = p.maxThreadsPerBlock; break;
    case cudaDevAttrWarpSize: *value = 32; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = (int)p.sharedMemPerBlock; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = (int)p.sharedMemPerBlockOptin; break;
    default:
      std::fprintf(stderr, "emu: cudaDeviceGetAttribute: attribute %d is not emulated\n",
                   (int)attr);
      return record(cudaErrorInvalidValue);
  }
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  emu::Runtime& r = emu::runtime();
  std::lock_guard<std::mutex> lock(r.mutex);
  *total_bytes = emu::host_memory_bytes();
  *free_bytes = *total_bytes > r.device_bytes ? *total_bytes - r.device_bytes : 0;
  return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) {
    std::fprintf(stderr, "emu: cudaFuncSetAttribute: attribute %d is not emulated\n", (int)attr);
    return record(cudaErrorInvalidValue);
  }
  if (value < 0 || (size_t)value > emu::kSharedPerBlockLimit) return record(cudaErrorInvalidValue);
  emu::Runtime& r = emu::runtime();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.dynamic_smem_limit[func] = value;
  return cudaSuccess;
}

// --- memory --------------------------------------------------------------------------------------
// Allocating and freeing separate the work of every stream from what follows (CUDA's implicit
// synchronisation): the queues run first, and a free never pulls memory from under queued work.
cudaError_t cudaMalloc(void** p, size_t bytes) {
  if (cudaError_t e = emu::capture_refuses_host_wait(nullptr, true, "cudaMalloc")) return e;
  emu::wait_device("cudaMalloc");
  return emu::allocate(p, bytes, emu::Memory::Device);
}
cudaError_t cudaFree(void* p) {
  if (cudaError_t e = emu::capture_refuses_host_wait(nullptr, true, "cudaFree")) return e;
  emu::wait_device("cudaFree");
  return emu::release(p, emu::Memory::Device);
}
cudaError_t cudaMallocHost(void** p, size_t bytes) {
  if (cudaError_t e = emu::capture_refuses_host_wait(nullptr, true, "cudaMallocHost")) return e;
  emu::wait_device("cudaMallocHost");
  return emu::allocate(p, bytes, emu::Memory::PinnedHost);
}
cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned int) {
  return cudaMallocHost(p, bytes);
}
cudaError_t cudaFreeHost(void* p) {
  if (cudaError_t e = emu::capture_refuses_host_wait(nullptr, true, "cudaFreeHost")) return e;
  emu::wait_device("cudaFreeHost");
  return emu::release(p, emu::Memory::PinnedHost);
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  return emu::copy(dst, src, bytes, kind, "cudaMemcpy", nullptr, true);
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t s) {
  return emu::copy(dst, src, bytes, kind, "cudaMemcpyAsync", s, false);
}
cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t s) {
  if (emu::check_device_range("cudaMemset", p, bytes) != cudaSuccess) return emu::last_error;
  if (!emu::valid_stream(s)) return record(cudaErrorInvalidResourceHandle);
  if (bytes == 0) return cudaSuccess;
  emu::submit(s, "cudaMemset", [p, value, bytes] {
    std::memset(p, value, bytes);
    return true;
  });
  return cudaSuccess;
}
cudaError_t cudaMemset(void* p, int value, size_t bytes) {
  return cudaMemsetAsync(p, value, bytes, nullptr);
}

cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attr, const void* p) {
  emu::Runtime& r = emu::runtime();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::memset(attr, 0, sizeof(*attr));
  attr->type = cudaMemoryTypeUnregistered;
  if (emu::find_region(p, 1, emu::Memory::Device)) {
    attr->type = cudaMemoryTypeDevice;
    attr->devicePointer = const_cast<void*>(p);
  } else if (emu::find_region(p, 1, emu::Memory::PinnedHost)) {
    attr->type = cudaMemoryTypeHost;
    attr->hostPointer = attr->devicePointer = const_cast<void*>(p);
  }
  return cudaSuccess;
}
