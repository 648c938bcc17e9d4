// kernels/cpu/runtime.cpp - device, memory, streams and events of the CPU backend.
//
// The "device" is the host: allocations are 64-byte aligned host memory, copies are memcpy,
// streams and events are trivial because every CPU op runs synchronously on the calling thread
// (using OpenMP inside). Events record host wall time so that the trainer's timing code works
// unchanged.
//
// Tricks:
// - Each allocation carries a 64-byte header holding its size, so release() can keep the
//   in-use/peak byte counters exact without a lookup table. The counters are atomics in a
//   function-local static (the one piece of process-wide state of the backend).
// - Fresh allocations are filled with 0xFF bytes (NaN in fp32 and bf16), as the GPU tests poison
//   outputs: code above the seam that reads memory it never wrote gets NaNs here instead of the
//   zeros a fresh host page would silently provide.
#include <omp.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "kernels/cpu/cpu_common.h"

namespace ops {

struct EventImpl {
  std::chrono::steady_clock::time_point time;
  bool recorded = false;
};

namespace {

constexpr size_t kAlignment = 64;  // also the header size, so the user pointer stays aligned

struct MemoryCounters {
  std::atomic<size_t> in_use{0};
  std::atomic<size_t> peak{0};
};
MemoryCounters& memory_counters() {
  static MemoryCounters counters;
  return counters;
}

void count_allocation(size_t bytes) {
  MemoryCounters& c = memory_counters();
  size_t now = c.in_use.fetch_add(bytes) + bytes;
  size_t peak = c.peak.load();
  while (now > peak && !c.peak.compare_exchange_weak(peak, now)) {
  }
}

}  // namespace

const char* backend_name() { return "cpu"; }

DeviceInfo device_init(int local_rank) {
  DeviceInfo info{};
  const int threads = omp_get_max_threads();
  std::snprintf(info.name, sizeof(info.name), "cpu (%d thread%s)", threads,
                threads == 1 ? "" : "s");
  info.total_memory = (size_t)sysconf(_SC_PHYS_PAGES) * (size_t)sysconf(_SC_PAGE_SIZE);
  unsigned long long available_kib = 0;  // MemAvailable: free plus what the page cache gives back
  if (FILE* f = std::fopen("/proc/meminfo", "r")) {
    char line[128];
    while (std::fgets(line, sizeof(line), f))
      if (std::sscanf(line, "MemAvailable: %llu kB", &available_kib) == 1) break;
    std::fclose(f);
  }
  info.free_memory = (size_t)available_kib * 1024;
  info.multiprocessors = threads;
  return info;
}

bool device_memory_is_host() { return true; }

void* alloc(size_t bytes) {
  const size_t total = round_up(bytes + kAlignment, kAlignment);
  char* base = (char*)std::aligned_alloc(kAlignment, total);
  CHECK(base != nullptr, "out of host memory allocating %zu bytes (%zu in use)", bytes,
        memory_in_use());
  *(size_t*)base = bytes;
  std::memset(base + kAlignment, 0xFF, bytes);
  count_allocation(bytes);
  return base + kAlignment;
}

void release(void* p) {
  if (!p) return;
  char* base = (char*)p - kAlignment;
  memory_counters().in_use.fetch_sub(*(size_t*)base);
  std::free(base);
}

size_t memory_in_use() { return memory_counters().in_use.load(); }
size_t memory_peak() { return memory_counters().peak.load(); }

void copy_to_device(void* dst, const void* src, size_t bytes) {
  if (bytes) std::memcpy(dst, src, bytes);
}
void copy_to_host(void* dst, const void* src, size_t bytes) {
  if (bytes) std::memcpy(dst, src, bytes);
}
void copy_to_device_async(void* dst, const void* src, size_t bytes, Stream s) {
  OP_SPAN(copy_to_device_async);
  if (is_dry(s)) return;
  if (bytes) std::memcpy(dst, src, bytes);
}
void copy_to_host_async(void* dst, const void* src, size_t bytes, Stream s) {
  OP_SPAN(copy_to_host_async);
  if (is_dry(s)) return;
  if (bytes) std::memcpy(dst, src, bytes);
}

// Host memory is the device's here: "pinned" is page-aligned (aligned file I/O needs it) and
// zeroed, and not in the device counters.
void* alloc_host_pinned(size_t bytes) {
  const size_t total = round_up(bytes > 0 ? bytes : 1, 4096);
  void* p = std::aligned_alloc(4096, total);
  CHECK(p != nullptr, "out of host memory allocating %zu bytes of pinned memory", bytes);
  std::memset(p, 0, total);
  return p;
}
void release_host_pinned(void* p) { std::free(p); }

void copy_on_device(void* dst, const void* src, size_t bytes, Stream s) {
  OP_SPAN(copy_on_device);
  if (is_dry(s)) return;
  if (bytes) std::memmove(dst, src, bytes);
}
void fill_zero(void* p, size_t bytes, Stream s) {
  OP_SPAN(fill_zero);
  if (is_dry(s)) return;
  if (bytes) std::memset(p, 0, bytes);
}

Stream stream_create(const StreamOptions& options) {
  Stream s = new StreamImpl;
  s->options = options;
  return s;
}
void stream_destroy(Stream s) {
  if (!is_dry(s)) delete s;
}
void stream_sync(Stream s) {}

Event event_create() { return new EventImpl; }
void event_destroy(Event e) { delete e; }
void event_record(Event e, Stream s) {
  if (is_dry(s)) return;
  e->time = std::chrono::steady_clock::now();
  e->recorded = true;
}
void stream_wait_event(Stream s, Event e) {}
void event_sync(Event e) {}
bool event_done(Event e) { return true; }  // CPU ops complete before they return
float event_elapsed_ms(Event start, Event end) {
  CHECK(start->recorded && end->recorded, "event_elapsed_ms on an event never recorded");
  return std::chrono::duration<float, std::milli>(end->time - start->time).count();
}

const char* attention_impl_name(Stream s) { return "cpu"; }
void* native_stream(Stream s) { return nullptr; }
void range_push(const char* name) {}
void range_pop() {}

// No graphs: every op runs when called (training/cuda_graph.h runs the step eagerly here).
bool graphs_supported() { return false; }
void graph_capture_begin(Stream) { FATAL("the CPU backend has no CUDA graphs"); }
Graph graph_capture_end(Stream) { FATAL("the CPU backend has no CUDA graphs"); }
void graph_launch(Graph, Stream) { FATAL("the CPU backend has no CUDA graphs"); }
void graph_destroy(Graph g) { CHECK(!g, "the CPU backend has no CUDA graphs"); }
bool stream_capturing(Stream) { return false; }

}  // namespace ops
