// training/cuda_graph.h - [kernels] cuda_graph = "step": the training step's forward and backward
// (every micro-batch through the pipeline schedule, with the gradient reductions: model/
// gpt_pipeline.h gpt_train_step) captured once as a CUDA graph and replayed every later step.
//
// The idea. A step of GPT-2 124M queues ~344 launches per micro-batch; each costs the host a few
// microseconds to queue, and a small model's kernels are shorter than that, so the GPU waits
// for the host. A graph is the step's work recorded once (cudaStreamBeginCapture .. EndCapture
// on the compute stream, the communication stream forked in and joined back by events) and then
// launched with one call (cudaGraphLaunch). What a replay runs is what the capture saw: every
// kernel's arguments by value, every pointer and size. So the step must be the same every step:
//   - its buffers never move: every allocation happens before the capture (step 1 runs eagerly,
//     so the lazy ones - a stream's scratch, cuBLASLt's cached descriptors, the attention choice -
//     are made there), and a stream's scratch that grows after a capture keeps its old buffer
//     alive (kernels/cuda/runtime.cu);
//   - its inputs are at fixed device addresses: the step's token ids, targets and document ids are
//     copied (from pageable host memory, which a capture cannot read) into device buffers here,
//     in stream order before the launch, and the captured micro-batches read those;
//   - nothing inside it waits on the host: the step is host-sync-free on the layouts that allow a
//     graph (training/step_readback.h); the others run eagerly and the log says why
//     (cuda_graph_refusal);
//   - the host bookkeeping the step's code does (the communication counters) is what the capture
//     step did, restored for each replay.
// The optimizer step (gradient norm, clipping, AdamW with this step's learning rate and count,
// which are kernel arguments that change every step) stays eager, after the graph on the same
// stream. Step 1 eager, step 2 captured and launched, steps 3.. replayed; the results are bitwise
// those of eager steps (test/test_cuda_graphs.py, on the emulated CUDA runtime: test/emu/graphs.cpp).
// The CPU backend has no graphs: it accepts the key and runs eagerly, saying so.
#pragma once
#include <functional>
#include <string>

#include "config/config.h"
#include "kernels/allocator.h"
#include "model/gpt_pipeline.h"
#include "parallel/comm.h"

struct StepGraph {
  bool on = false;               // capturing and replaying on this run
  std::string eager_reason;      // why not, when [kernels] cuda_graph asks for it ("" = asked not)
  int steps = 0;                 // steps run through step_graph_run
  ops::Graph graph = nullptr;
  ops::Stream compute = nullptr, comm = nullptr;
  ops::Event fork = nullptr, join = nullptr, before = nullptr, after = nullptr;
  Allocator inputs;              // the step's token ids, targets, documents on the device
  int* tokens = nullptr;
  int* targets = nullptr;
  int* docs = nullptr;
  int* doc_positions = nullptr;
  int cp = 1;
  CommStats captured_stats{};    // the communication counters of the captured step
};

// Why this run cannot capture its step ("" when it can): a layout whose step waits on the host,
// or whose host state changes inside it, named with the reason. `backend` is ops::backend_name().
std::string cuda_graph_refusal(const Config& cfg, const char* backend);
// Sets g up for the run (the input buffers sized for a step's micro-batches) and returns the
// log line saying what runs ("" when the key is "off").
std::string step_graph_init(StepGraph& g, const Config& cfg, const char* backend,
                            ops::Stream compute, ops::Stream comm);
void step_graph_destroy(StepGraph& g);
// The step's micro-batches at g's device buffers (copied there, in stream order on the compute
// stream), for a graphed step; mb itself otherwise.
MicroBatches step_graph_inputs(StepGraph& g, const MicroBatches& mb);
// Runs `step` (the forward and backward on g.compute and g.comm): eagerly, or captured into
// the graph and launched, or the graph replayed. `stats` is the communication counters, which
// a replay sets to the captured step's.
void step_graph_run(StepGraph& g, const std::function<void()>& step, CommStats& stats);
