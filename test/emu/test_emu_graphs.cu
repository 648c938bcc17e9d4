// test/emu/test_emu_graphs.cu - the emulator's CUDA graphs (test/emu/graphs.cpp): capture and
// replay of kernels, copies, memsets and a fork/join over two streams; a kernel argument taken
// by value at capture (a host variable changed afterwards is not seen by a replay, as on a
// GPU); and the calls CUDA prohibits during a capture refused, invalidating it.
#include <cuda_runtime.h>

#include "test/emu/test_emu.h"

__global__ void graph_axpy(float* y, const float* x, float a, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] += a * x[i];
}

namespace {

// y = 0; y += a x (stream s); y += 2 x on a forked stream, joined back.
void capture_step(cudaStream_t s, cudaStream_t side, cudaEvent_t fork, cudaEvent_t join,
                  float* y, const float* x, float a, int n) {
  cudaMemsetAsync(y, 0, n * sizeof(float), s);
  graph_axpy<<<1, 64, 0, s>>>(y, x, a, n);
  cudaEventRecord(fork, s);
  cudaStreamWaitEvent(side, fork, 0);
  graph_axpy<<<1, 64, 0, side>>>(y, x, 2.0f, n);
  cudaEventRecord(join, side);
  cudaStreamWaitEvent(s, join, 0);
}

}  // namespace

void test_graphs() {
  const int n = 40;
  float* x = device<float>(n);
  float* y = device<float>(n);
  std::vector<float> hx(n);
  for (int i = 0; i < n; i++) hx[i] = (float)i;
  upload(x, hx);
  cudaStream_t s, side;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking);
  cudaEvent_t fork, join;
  cudaEventCreate(&fork);
  cudaEventCreate(&join);

  float a = 3.0f;  // a host variable passed by value at capture
  cudaGraph_t graph = nullptr;
  cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
  capture_step(s, side, fork, join, y, x, a, n);
  cudaStreamCaptureStatus status;
  cudaStreamIsCapturing(side, &status);
  const bool side_joined = status == cudaStreamCaptureStatusActive;
  const cudaError_t ended = cudaStreamEndCapture(s, &graph);
  cudaStreamSynchronize(s);
  check(ended == cudaSuccess && side_joined && host(y, n)[5] != 25.0f,
        "capture over a fork/join of two streams: nothing ran while capturing");
  cudaGraphExec_t exec = nullptr;
  cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  a = 10.0f;  // changed after capture: the replay still multiplies by 3
  for (int rep = 0; rep < 2; rep++) cudaGraphLaunch(exec, s);
  cudaStreamSynchronize(s);
  std::vector<float> hy = host(y, n);
  bool ok = true;
  for (int i = 0; i < n; i++) ok = ok && hy[i] == 5.0f * i;
  check(ok, "two replays: memset, the captured a = 3 (host value since changed to 10), the side "
        "stream's 2x: y = 5x");
  hx[7] = 100.0f;  // the data at the captured pointer changes: the replay reads it
  upload(x, hx);
  cudaGraphLaunch(exec, s);
  cudaStreamSynchronize(s);
  check(host(y, n)[7] == 500.0f, "a replay reads the captured pointers' current contents");

  // Prohibited during a capture: each invalidates it.
  cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
  graph_axpy<<<1, 64, 0, s>>>(y, x, a, n);
  const cudaError_t synced = cudaStreamSynchronize(s);
  check(synced == cudaErrorStreamCaptureUnsupported &&
        cudaStreamEndCapture(s, &graph) == cudaErrorStreamCaptureInvalidated && !graph,
        "cudaStreamSynchronize during capture: refused, the capture invalidated");
  cudaGetLastError();
  cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
  void* p = nullptr;
  const cudaError_t malloced = cudaMalloc(&p, 64);
  check(malloced == cudaErrorStreamCaptureUnsupported &&
        cudaStreamEndCapture(s, &graph) == cudaErrorStreamCaptureInvalidated,
        "cudaMalloc during capture: refused, the capture invalidated");
  cudaGetLastError();
  cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
  const cudaError_t pageable =
      cudaMemcpyAsync(y, hx.data(), n * sizeof(float), cudaMemcpyHostToDevice, s);
  check(pageable == cudaErrorStreamCaptureUnsupported &&
        cudaStreamEndCapture(s, &graph) == cudaErrorStreamCaptureInvalidated,
        "a copy from pageable memory during capture: refused, the capture invalidated");
  cudaGetLastError();
  cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
  cudaEventRecord(fork, s);
  cudaStreamWaitEvent(side, fork, 0);
  graph_axpy<<<1, 64, 0, side>>>(y, x, a, n);
  check(cudaStreamEndCapture(s, &graph) == cudaErrorStreamCaptureUnjoined,
        "a forked stream not joined back: cudaErrorStreamCaptureUnjoined");
  cudaGetLastError();
  const cudaError_t stale = cudaStreamWaitEvent(s, fork, 0);
  check(stale == cudaErrorStreamCaptureIsolation,
        "waiting outside the capture for an event last recorded in it: refused");
  cudaGetLastError();

  cudaGraphExecDestroy(exec);
  cudaEventDestroy(fork);
  cudaEventDestroy(join);
  cudaStreamDestroy(side);
  cudaStreamDestroy(s);
  cudaFree(x);
  cudaFree(y);
}
