// kernels/cuda/runtime.cu - the CUDA backend's device, memory, stream and event functions
// (kernels/ops_decls.h, first section). No kernels here.
//
// - device_init picks GPU local_rank % count, so that the ranks of a node share its GPUs evenly.
// - alloc/release wrap cudaMalloc/cudaFree and keep a ledger of live allocations (a function-local
//   static map guarded by a mutex) so that memory_in_use/memory_peak are exact and an
//   out-of-memory failure can say what was asked, what we hold, and what the device has left.
// - copy_to_device/copy_to_host are synchronous with respect to *all* earlier work: our streams
//   are non-blocking, so a plain cudaMemcpy would not wait for them (and a pageable host-to-device
//   copy may still be in flight when it returns). Both therefore synchronise the device before and
//   after the copy. They are meant for set-up, checkpoints and tests, not for the inner loop.
// - A stream owns a cudaStream_t (non-blocking), a cuBLASLt handle with a 32 MiB workspace, a
//   scratch buffer for reductions that grows on demand to the largest request in whole MiB, and the cuDNN handle that attention
//   creates on first use (destroyed here, with the stream).
// - Pinned host memory (alloc_host_pinned: cudaMallocHost) makes copy_to_host_async and
//   copy_to_device_async real DMA transfers that overlap kernels (optimizer offload).
// - Events are created with timing enabled; ranges go to NVTX3 (header-only, no library to link).
// - CUDA graphs (training/cuda_graph.h): capture on a stream in the global mode, instantiate,
//   launch. Once a graph exists, a stream's scratch that grows keeps the outgrown buffer (a
//   replay still reads and writes it) until the stream is destroyed.
#include <nvtx3/nvToolsExt.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "kernels/cuda/attention_cudnn.cuh"
#include "kernels/cuda/cuda_common.cuh"

namespace ops {

namespace {

constexpr size_t kMiB = size_t(1) << 20;
constexpr size_t kCublasWorkspaceBytes = 32 * kMiB;  // training/device_memory.h plans it

// Every live allocation made through alloc(), with the running and peak totals.
struct MemoryLedger {
  std::mutex mutex;
  std::unordered_map<void*, size_t> sizes;
  size_t in_use = 0;
  size_t peak = 0;
};
MemoryLedger& memory_ledger() {
  static MemoryLedger ledger;  // lazily created, lives until exit
  return ledger;
}

// Set once a graph was captured: from then on a stream's scratch that grows keeps its old
// buffer (a graph's kernels may read and write it at every replay) until the stream is destroyed.
std::atomic<bool>& graphs_captured() {
  static std::atomic<bool> captured{false};
  return captured;
}

[[noreturn]] void report_out_of_memory(size_t bytes) {
  cudaGetLastError();  // clear the allocation error so that the queries below succeed
  size_t free_bytes = 0, total_bytes = 0;
  cudaMemGetInfo(&free_bytes, &total_bytes);
  int device = -1;
  cudaGetDevice(&device);
  FATAL("out of GPU memory on device %d: alloc of %zu bytes (%.1f MiB) failed; %.1f MiB are in "
        "use through alloc() (peak %.1f MiB), %.1f MiB of %.1f MiB are free on the device",
        device, bytes, (double)bytes / kMiB, (double)memory_in_use() / kMiB,
        (double)memory_peak() / kMiB, (double)free_bytes / kMiB, (double)total_bytes / kMiB);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Device
// ---------------------------------------------------------------------------------------------
const char* backend_name() { return "cuda"; }

DeviceInfo device_init(int local_rank) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  CHECK(err == cudaSuccess && count > 0, "no CUDA device found (%s); use ./train_cpu on a machine "
        "without a GPU", err == cudaSuccess ? "0 devices" : cudaGetErrorString(err));
  int device = local_rank % count;
  CUDA_CHECK(cudaSetDevice(device));
  cudaDeviceProp prop;
  CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  DeviceInfo info;
  std::snprintf(info.name, sizeof(info.name), "%s", prop.name);
  info.total_memory = prop.totalGlobalMem;
  size_t free_bytes = 0, total_bytes = 0;
  info.free_memory = cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess ? free_bytes : 0;
  info.multiprocessors = prop.multiProcessorCount;
  return info;
}

bool device_memory_is_host() { return false; }

// ---------------------------------------------------------------------------------------------
// Memory
// ---------------------------------------------------------------------------------------------
void* alloc(size_t bytes) {
  void* p = nullptr;
  // cudaMalloc(0) would hand back nullptr; one byte keeps every allocation a distinct pointer.
  if (cudaMalloc(&p, bytes > 0 ? bytes : 1) != cudaSuccess) report_out_of_memory(bytes);
  MemoryLedger& ledger = memory_ledger();
  std::lock_guard<std::mutex> lock(ledger.mutex);
  ledger.sizes[p] = bytes;
  ledger.in_use += bytes;
  if (ledger.in_use > ledger.peak) ledger.peak = ledger.in_use;
  return p;
}

void release(void* p) {
  if (!p) return;
  {
    MemoryLedger& ledger = memory_ledger();
    std::lock_guard<std::mutex> lock(ledger.mutex);
    auto it = ledger.sizes.find(p);
    CHECK(it != ledger.sizes.end(), "release(%p): not a pointer returned by alloc()", p);
    ledger.in_use -= it->second;
    ledger.sizes.erase(it);
  }
  CUDA_CHECK(cudaFree(p));
}

void copy_to_device(void* dst, const void* src, size_t bytes) {
  CUDA_CHECK(cudaDeviceSynchronize());  // earlier kernels may still read or write dst
  CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaDeviceSynchronize());  // a pageable copy may return before the data landed
}

void copy_to_host(void* dst, const void* src, size_t bytes) {
  CUDA_CHECK(cudaDeviceSynchronize());  // earlier kernels on non-blocking streams may write src
  CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
}

void copy_to_device_async(void* dst, const void* src, size_t bytes, Stream s) {
  OP_SPAN(copy_to_device_async);
  if (is_dry(s)) return;
  if (bytes == 0) return;
  // From pageable memory, CUDA copies src into a staging buffer before returning.
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s->stream));
}

void copy_to_host_async(void* dst, const void* src, size_t bytes, Stream s) {
  OP_SPAN(copy_to_host_async);
  if (is_dry(s)) return;
  if (bytes == 0) return;
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s->stream));
}

// Page-locked, so that the copies above are DMA transfers that overlap the kernels; zeroed like
// the CPU backend's. cudaMallocHost(0) would hand back nullptr: one byte keeps it distinct.
void* alloc_host_pinned(size_t bytes) {
  void* p = nullptr;
  if (cudaMallocHost(&p, bytes > 0 ? bytes : 1) != cudaSuccess) {
    cudaGetLastError();
    FATAL("out of pinned host memory: cudaMallocHost of %zu bytes (%.1f MiB) failed", bytes,
          (double)bytes / kMiB);
  }
  std::memset(p, 0, bytes);
  return p;
}

void release_host_pinned(void* p) {
  if (p) CUDA_CHECK(cudaFreeHost(p));
}

void copy_on_device(void* dst, const void* src, size_t bytes, Stream s) {
  OP_SPAN(copy_on_device);
  if (is_dry(s)) return;
  if (bytes == 0) return;
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s->stream));
}

void fill_zero(void* p, size_t bytes, Stream s) {
  OP_SPAN(fill_zero);
  if (is_dry(s)) return;
  if (bytes == 0) return;
  CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, s->stream));
}

size_t memory_in_use() {
  MemoryLedger& ledger = memory_ledger();
  std::lock_guard<std::mutex> lock(ledger.mutex);
  return ledger.in_use;
}

size_t memory_peak() {
  MemoryLedger& ledger = memory_ledger();
  std::lock_guard<std::mutex> lock(ledger.mutex);
  return ledger.peak;
}

// ---------------------------------------------------------------------------------------------
// Streams
// ---------------------------------------------------------------------------------------------
Stream stream_create(const StreamOptions& options) {
  StreamImpl* s = new StreamImpl;
  s->options = options;
  CUDA_CHECK(cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking));
  CUBLAS_CHECK(cublasLtCreate(&s->lt));
  s->workspace_bytes = kCublasWorkspaceBytes;
  s->workspace = alloc(s->workspace_bytes);
  return s;
}

void stream_destroy(Stream s) {
  if (!s || is_dry(s)) return;
  stream_sync(s);
  cudnn_sdpa::release_stream_state(s);
  release_gemm_signatures(s);
  release(s->scratch);
  for (void* p : s->kept_scratch) release(p);
  release(s->workspace);
  CUBLAS_CHECK(cublasLtDestroy(s->lt));
  CUDA_CHECK(cudaStreamDestroy(s->stream));
  delete s;
}

void stream_sync(Stream s) {
  if (is_dry(s)) return;
  CUDA_CHECK(cudaStreamSynchronize(s->stream));
}

// Grows to the request rounded up to a whole MiB. A training step asks for the same sizes every
// step, so it grows only during the first one, and its final size is a function of the largest
// request alone (not of their order, as doubling would make it): the step's largest request
// rounded up to a MiB, which is what the planner counts (training/device_memory.h). The old
// buffer may still be read by queued kernels: wait for the stream before freeing it.
void* stream_scratch(Stream s, size_t bytes) {
  CHECK(s != nullptr, "stream_scratch needs a stream");
  if (bytes <= s->scratch_bytes) return s->scratch;
  const size_t grown = round_up(bytes, kMiB);
  if (s->scratch && graphs_captured().load()) {
    s->kept_scratch.push_back(s->scratch);  // a captured graph may use it
  } else if (s->scratch) {
    stream_sync(s);
    release(s->scratch);
  }
  s->scratch = nullptr;
  s->scratch_bytes = 0;
  s->scratch = alloc(grown);
  s->scratch_bytes = grown;
  return s->scratch;
}

void* native_stream(Stream s) { return s && !is_dry(s) ? (void*)s->stream : nullptr; }

// "auto" until the first attention call on the stream, then the note attention.cu leaves.
const char* attention_impl_name(Stream s) {
  if (is_dry(s)) return "none (dry run)";
  return s->attention_note[0] ? s->attention_note : "auto";
}

// ---------------------------------------------------------------------------------------------
// Events and profiler ranges
// ---------------------------------------------------------------------------------------------
Event event_create() {
  EventImpl* e = new EventImpl;
  CUDA_CHECK(cudaEventCreate(&e->event));  // default flags: timing enabled
  return e;
}

void event_destroy(Event e) {
  if (!e) return;
  CUDA_CHECK(cudaEventDestroy(e->event));
  delete e;
}

void event_record(Event e, Stream s) {
  if (is_dry(s)) return;
  CUDA_CHECK(cudaEventRecord(e->event, s->stream));
}

void stream_wait_event(Stream s, Event e) {
  if (is_dry(s)) return;
  CUDA_CHECK(cudaStreamWaitEvent(s->stream, e->event, 0));
}

void event_sync(Event e) { CUDA_CHECK(cudaEventSynchronize(e->event)); }

bool event_done(Event e) {
  const cudaError_t r = cudaEventQuery(e->event);
  if (r == cudaErrorNotReady) return false;
  CUDA_CHECK(r);
  return true;
}

float event_elapsed_ms(Event start, Event end) {
  CUDA_CHECK(cudaEventSynchronize(end->event));
  float ms = 0.0f;
  CUDA_CHECK(cudaEventElapsedTime(&ms, start->event, end->event));
  return ms;
}

void range_push(const char* name) { nvtxRangePushA(name); }
void range_pop() { nvtxRangePop(); }

// ---------------------------------------------------------------------------------------------
// CUDA graphs: stream capture (global mode: a host wait or an allocation anywhere during the
// capture invalidates it) and replay
// ---------------------------------------------------------------------------------------------
struct GraphImpl {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
};

bool graphs_supported() { return true; }

void graph_capture_begin(Stream s) {
  CHECK(!is_dry(s), "graph_capture_begin on the dry stream");
  CUDA_CHECK(cudaStreamBeginCapture(s->stream, cudaStreamCaptureModeGlobal));
}

Graph graph_capture_end(Stream s) {
  GraphImpl* g = new GraphImpl;
  const cudaError_t err = cudaStreamEndCapture(s->stream, &g->graph);
  CHECK(err == cudaSuccess, "the step's CUDA graph capture failed: %s (a host wait, an "
        "allocation or an unjoined stream inside the step; [kernels] cuda_graph = \"off\" runs "
        "it eagerly)", cudaGetErrorString(err));
  CUDA_CHECK(cudaGraphInstantiate(&g->exec, g->graph, 0));
  graphs_captured().store(true);
  return g;
}

void graph_launch(Graph g, Stream s) {
  if (is_dry(s)) return;
  CUDA_CHECK(cudaGraphLaunch(g->exec, s->stream));
}

bool stream_capturing(Stream s) {
  if (!s || is_dry(s)) return false;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  CUDA_CHECK(cudaStreamIsCapturing(s->stream, &status));
  return status != cudaStreamCaptureStatusNone;
}

void graph_destroy(Graph g) {
  if (!g) return;
  CUDA_CHECK(cudaGraphExecDestroy(g->exec));
  CUDA_CHECK(cudaGraphDestroy(g->graph));
  delete g;
}

}  // namespace ops
