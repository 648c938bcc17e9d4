// test/emu/ops_host_memory.cpp - TEST-ONLY: the ops:: memory, stream and event functions that
// test/test_comm.cpp and parallel/comm*.cu call, over plain host memory, so that the project's
// communicator test runs on the NCCL backend (parallel/comm_nccl.cu) with the NCCL stand-in and
// without the emulator core (test/emu/LIBRARIES.md, "test_comm on the NCCL backend").
//
// It is not a second runtime: on the CUDA backend these functions are kernels/cuda/runtime.cu's,
// over cudaMalloc & co, which in the emulated build come from the emulator core (emulated device
// memory is host memory). This file keeps exactly that contract and nothing more: "device"
// buffers are malloc'ed host memory the NCCL stand-in reads and writes directly,
// device_memory_is_host() is false as on the CUDA backend (so the MPI backend would stage), and
// the stream handed to NCCL is the null stream. Once the emulated trainer links the real
// runtime.cu, the same test can link that instead of this file.
#include <cstdlib>
#include <cstring>

#include "kernels/ops.h"

namespace ops {

DeviceInfo device_init(int local_rank) {
  DeviceInfo info{};
  std::strcpy(info.name, "host memory (test/emu/ops_host_memory.cpp)");
  return info;
}
bool device_memory_is_host() { return false; }

void* alloc(size_t bytes) {
  void* p = std::malloc(bytes > 0 ? bytes : 1);
  CHECK(p != nullptr, "test host memory: malloc of %zu bytes failed", bytes);
  return p;
}
void release(void* p) { std::free(p); }

void copy_to_device(void* dst, const void* src, size_t n) { std::memmove(dst, src, n); }
void copy_to_host(void* dst, const void* src, size_t n) { std::memmove(dst, src, n); }
void copy_on_device(void* dst, const void* src, size_t n, Stream) { std::memmove(dst, src, n); }
void stream_sync(Stream) {}
bool stream_capturing(Stream) { return false; }  // no graphs here (the watchdog asks)
void* native_stream(Stream) { return nullptr; }
// Events, for the NCCL watchdog (parallel/comm_nccl.cu): the stand-in completes every operation
// before it returns, so a recorded event is always done.
Event event_create() { return reinterpret_cast<Event>(new char(0)); }
void event_destroy(Event e) { delete reinterpret_cast<char*>(e); }
void event_record(Event, Stream) {}
bool event_done(Event) { return true; }
// The trace recorder's (kernels/trace.h) other calls: no step is traced in these tests.
void event_sync(Event) {}
float event_elapsed_ms(Event, Event) { return 0; }
void range_push(const char*) {}
void range_pop() {}

}  // namespace ops
