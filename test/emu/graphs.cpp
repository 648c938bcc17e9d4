// test/emu/graphs.cpp - CUDA graphs in the emulated runtime: stream capture
// (cudaStreamBeginCapture .. cudaStreamEndCapture), instantiation and replay (cudaGraphLaunch).
//
// The idea, as CUDA defines it: while a stream captures, the work pushed into it does not run;
// it becomes a node of a graph, with the work's arguments as they were at the call (a kernel's
// parameters by value, a copy's pointers and size, a memset's value, a cuBLASLt call's
// descriptors and its host-side alpha/beta, an NCCL call's buffers and counts). Replaying the
// graph runs those records again, so a pointer, a size or a host value that changes after
// capture is NOT seen by the replay: a program that reallocates a buffer or passes a host
// variable that changes computes from the old one - a wrong result, which is what the trainer's
// graph-against-eager test looks for (test/test_cuda_graphs.py).
//
// Who talks to whom. Every piece of stream work reaches streams.cpp through enqueue_work or
// enqueue_made (include/emu_streams.h); streams.cpp first offers it here (capture_take). A
// capturing stream's work becomes a node whose dependencies are the stream's current tail. An
// event recorded on a capturing stream keeps that tail (capture_event_record), and a stream that
// waits for such an event joins the capture with it (capture_wait_event): the fork/join pattern
// with which multi-stream work (a communication stream beside the compute stream) is captured.
// Each joined stream is a lane of the graph. cudaStreamEndCapture requires every node to be an
// ancestor of the origin stream's tail (every fork joined back), else
// cudaErrorStreamCaptureUnjoined.
//
// Replay (cudaGraphLaunch on stream L): lane 0 (the origin) runs on L, each other lane on an
// internal stream the executable graph owns; each lane first waits for L's earlier work, the
// nodes are queued in capture order on their lanes with a wait for every dependency on another
// lane, and L finally waits for every lane. So a replay is ordered as the captured streams were,
// under every EMU_STREAMS schedule. A node is remade for each replay from its maker (the
// stand-ins' NCCL calls take fresh message serial numbers then, as every replay is a new
// collective; a kernel, copy or GEMM is a copy of the recorded closure).
//
// What CUDA prohibits during capture fails here too (the call reports why on stderr, sets
// cudaErrorStreamCaptureUnsupported and invalidates the capture, so cudaStreamEndCapture returns
// cudaErrorStreamCaptureInvalidated): a host wait on a capturing stream or on the device
// (cudaStreamSynchronize, cudaEventSynchronize or cudaEventQuery of a captured event,
// cudaStreamQuery, cudaDeviceSynchronize, a blocking cudaMemcpy), cudaMalloc, cudaFree,
// cudaMallocHost, cudaFreeHost (global capture mode, the default), a cudaMemcpyAsync to or from
// pageable host memory, and a capturing stream waiting for an event recorded outside the capture.
// An event whose last record was captured marks nothing outside the graph (a replay does not
// record it): waiting for it or querying it after the capture is an error here
// (cudaErrorStreamCaptureIsolation), which catches eager work that trusts such an event.
// One capture at a time (what the trainer needs); cudaStreamCaptureModeGlobal semantics for all.
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "test/emu/emu_internal.h"
#include "test/emu/include/emu_streams.h"

struct CaptureNode {
  int lane;
  std::vector<int> deps;  // nodes that must finish first
  const char* what;
  emu::WorkMaker make;
};
struct CUgraph_st {
  std::vector<CaptureNode> nodes;
  int lanes = 1;
};
struct CUgraphExec_st {
  CUgraph_st graph;                  // a copy: the graph may be destroyed after instantiation
  std::vector<cudaStream_t> lanes;   // lanes[0] unused (the launch stream)
};

namespace emu {

namespace {

struct LaneState {
  int lane;
  std::vector<int> tail;  // the nodes the stream's next work depends on
};

struct Capture {
  bool active = false;
  bool invalid = false;
  cudaStream_t origin = nullptr;
  CUgraph_st* graph = nullptr;
  std::map<cudaStream_t, LaneState> streams;
};

struct Graphs {
  std::recursive_mutex mutex;
  Capture capture;
  std::map<cudaEvent_t, std::vector<int>> event_tails;  // events recorded in the capture
  std::set<cudaEvent_t> captured_events;  // last recorded during a capture (any, until re-recorded)
};

Graphs& graphs() {
  static Graphs* g = new Graphs;  // never destroyed, as the streams
  return *g;
}

void invalidate(Graphs& g, const char* call, const char* why) {
  std::fprintf(stderr, "emu: %s during stream capture: %s; the capture is invalidated "
               "(cudaErrorStreamCaptureUnsupported, as on a GPU)\n", call, why);
  g.capture.invalid = true;
  set_last_error(cudaErrorStreamCaptureUnsupported);
}

// Unions b into a (both small).
void merge(std::vector<int>& a, const std::vector<int>& b) {
  for (int x : b) {
    bool seen = false;
    for (int y : a) seen = seen || x == y;
    if (!seen) a.push_back(x);
  }
}

}  // namespace

bool capture_active() { return graphs().capture.active; }

bool stream_capturing(cudaStream_t stream) {
  Graphs& g = graphs();
  std::lock_guard<std::recursive_mutex> lock(g.mutex);
  return g.capture.active && g.capture.streams.count(stream);
}

bool capture_take(cudaStream_t stream, const char* what, const WorkMaker& make) {
  Graphs& g = graphs();
  std::lock_guard<std::recursive_mutex> lock(g.mutex);
  Capture& c = g.capture;
  if (!c.active) return false;
  auto it = c.streams.find(stream);
  if (it == c.streams.end()) return false;
  if (c.invalid) return true;  // dropped: the capture will fail at its end
  c.graph->nodes.push_back(CaptureNode{it->second.lane, it->second.tail, what, make});
  it->second.tail = {(int)c.graph->nodes.size() - 1};
  return true;
}

bool capture_event_record(cudaEvent_t e, cudaStream_t stream) {
  Graphs& g = graphs();
  std::lock_guard<std::recursive_mutex> lock(g.mutex);
  Capture& c = g.capture;
  auto it = c.active ? c.streams.find(stream) : c.streams.end();
  if (it == c.streams.end()) {
    g.captured_events.erase(e);
    return false;
  }
  g.event_tails[e] = it->second.tail;
  g.captured_events.insert(e);
  return true;
}

// cudaSuccess and *handled: the wait joined or extended a capture; cudaSuccess and !*handled:
// an ordinary wait; an error: refused.
cudaError_t capture_wait_event(cudaStream_t stream, cudaEvent_t e, bool* handled) {
  Graphs& g = graphs();
  std::lock_guard<std::recursive_mutex> lock(g.mutex);
  Capture& c = g.capture;
  *handled = false;
  const bool in_capture = c.active && c.streams.count(stream);
  auto tail = c.active ? g.event_tails.find(e) : g.event_tails.end();
  if (tail != g.event_tails.end()) {
    *handled = true;
    if (in_capture) {
      merge(c.streams[stream].tail, tail->second);
    } else {
      c.streams[stream] = LaneState{c.graph->lanes++, tail->second};  // the stream joins
    }
    return cudaSuccess;
  }
  if (in_capture) {
    invalidate(g, "cudaStreamWaitEvent", "a capturing stream waits for an event recorded outside "
               "the capture (CUDA requires cudaEventWaitExternal)");
    *handled = true;
    return cudaErrorStreamCaptureIsolation;
  }
  if (g.captured_events.count(e)) {
    std::fprintf(stderr, "emu: cudaStreamWaitEvent: the event was last recorded during a stream "
                 "capture; it marks no work outside the graph (a replay does not record it)\n");
    *handled = true;
    set_last_error(cudaErrorStreamCaptureIsolation);
    return cudaErrorStreamCaptureIsolation;
  }
  return cudaSuccess;
}

cudaError_t capture_refuses_event_use(cudaEvent_t e, const char* call) {
  Graphs& g = graphs();
  std::lock_guard<std::recursive_mutex> lock(g.mutex);
  if (!g.captured_events.count(e)) return cudaSuccess;
  if (g.capture.active) {
    invalidate(g, call, "the event was recorded in the capture");
    return cudaErrorStreamCaptureUnsupported;
  }
  std::fprintf(stderr, "emu: %s: the event was last recorded during a stream capture; it marks "
               "no work outside the graph\n", call);
  set_last_error(cudaErrorStreamCaptureIsolation);
  return cudaErrorStreamCaptureIsolation;
}

// A host wait (stream null: the device) or an allocation while a capture runs.
cudaError_t capture_refuses_host_wait(cudaStream_t stream, bool whole_device, const char* call) {
  Graphs& g = graphs();
  std::lock_guard<std::recursive_mutex> lock(g.mutex);
  if (!g.capture.active) return cudaSuccess;
  if (!whole_device && !g.capture.streams.count(stream)) return cudaSuccess;
  invalidate(g, call, whole_device ? "it waits for the whole device or allocates (prohibited in "
             "the global capture mode)" : "it waits for a capturing stream");
  return cudaErrorStreamCaptureUnsupported;
}

cudaError_t capture_refuses_pageable(cudaStream_t stream, const char* call) {
  Graphs& g = graphs();
  std::lock_guard<std::recursive_mutex> lock(g.mutex);
  if (!g.capture.active || !g.capture.streams.count(stream)) return cudaSuccess;
  invalidate(g, call, "a copy to or from pageable host memory cannot be captured");
  return cudaErrorStreamCaptureUnsupported;
}

}  // namespace emu

using emu::set_last_error;

namespace {
cudaError_t refuse(cudaError_t err, const char* why) {
  std::fprintf(stderr, "emu: %s\n", why);
  set_last_error(err);
  return err;
}

// Every node must be an ancestor of the origin's tail: each fork joined back.
bool all_joined(const CUgraph_st& graph, const std::vector<int>& tail) {
  std::vector<char> reach(graph.nodes.size(), 0);
  for (int t : tail) reach[t] = 1;
  for (int i = (int)graph.nodes.size() - 1; i >= 0; i--)
    if (reach[i])
      for (int d : graph.nodes[i].deps) reach[d] = 1;
  for (char r : reach)
    if (!r) return false;
  return true;
}
}  // namespace

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode) {
  if (!stream || stream == cudaStreamLegacy || !emu::valid_stream(stream))
    return refuse(cudaErrorStreamCaptureUnsupported, "cudaStreamBeginCapture: not on the legacy "
                  "stream or an invalid one");
  emu::Graphs& g = emu::graphs();
  std::lock_guard<std::recursive_mutex> lock(g.mutex);
  if (g.capture.active)
    return refuse(cudaErrorIllegalState, "cudaStreamBeginCapture: one capture at a time here");
  g.capture = emu::Capture{};
  g.capture.active = true;
  g.capture.origin = stream;
  g.capture.graph = new CUgraph_st;
  g.capture.streams[stream] = emu::LaneState{0, {}};
  g.event_tails.clear();
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  emu::Graphs& g = emu::graphs();
  std::lock_guard<std::recursive_mutex> lock(g.mutex);
  emu::Capture& c = g.capture;
  if (!c.active || c.origin != stream)
    return refuse(cudaErrorIllegalState, "cudaStreamEndCapture: the stream does not capture");
  const bool joined = all_joined(*c.graph, c.streams[stream].tail);
  CUgraph_st* made = c.graph;
  const bool invalid = c.invalid;
  c = emu::Capture{};
  g.event_tails.clear();
  *graph = nullptr;
  if (invalid) {
    delete made;
    return refuse(cudaErrorStreamCaptureInvalidated, "cudaStreamEndCapture: the capture was "
                  "invalidated (see above)");
  }
  if (!joined) {
    delete made;
    return refuse(cudaErrorStreamCaptureUnjoined, "cudaStreamEndCapture: a stream forked into "
                  "the capture was not joined back into the origin stream");
  }
  *graph = made;
  return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status) {
  *status = emu::stream_capturing(stream) ? cudaStreamCaptureStatusActive
                                          : cudaStreamCaptureStatusNone;
  return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
  if (!graph) return refuse(cudaErrorInvalidValue, "cudaGraphInstantiate: no graph");
  auto* e = new CUgraphExec_st;
  e->graph = *graph;
  e->lanes.assign(graph->lanes, nullptr);
  for (int l = 1; l < graph->lanes; l++)
    cudaStreamCreateWithFlags(&e->lanes[l], cudaStreamNonBlocking);
  *exec = e;
  return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  if (!exec || !emu::valid_stream(stream))
    return refuse(cudaErrorInvalidResourceHandle, "cudaGraphLaunch: no graph or no stream");
  if (emu::stream_capturing(stream))
    return refuse(cudaErrorStreamCaptureUnsupported, "cudaGraphLaunch into a capture: not here");
  const CUgraph_st& graph = exec->graph;
  std::vector<cudaStream_t> lanes = exec->lanes;
  lanes[0] = stream;
  for (int l = 1; l < graph.lanes; l++) emu::queue_wait(lanes[l], stream);
  std::vector<uint64_t> position(graph.nodes.size());
  for (size_t i = 0; i < graph.nodes.size(); i++) {
    const CaptureNode& n = graph.nodes[i];
    for (int d : n.deps)
      if (graph.nodes[d].lane != n.lane)
        emu::queue_wait_position(lanes[n.lane], lanes[graph.nodes[d].lane], position[d]);
    position[i] = emu::queue_push(lanes[n.lane], n.what, n.make());
  }
  for (int l = 1; l < graph.lanes; l++) emu::queue_wait(stream, lanes[l]);
  return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  if (!exec) return cudaSuccess;
  for (size_t l = 1; l < exec->lanes.size(); l++) cudaStreamDestroy(exec->lanes[l]);
  delete exec;
  return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  delete graph;
  return cudaSuccess;
}
