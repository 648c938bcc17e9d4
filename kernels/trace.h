// kernels/trace.h - per-rank timelines of chosen steps as Chrome trace-event JSON, which Perfetto
// (ui.perfetto.dev) and chrome://tracing open: `[log] trace = "DIR"`, `trace_steps = [a, b]`.
//
// What: each rank writes DIR/rank_<r>.json, one process per rank (pid = world rank) with three
// threads: the host (tid 0: the step, data loading, checkpoint phases), the compute stream (tid 1:
// pipeline actions F/B/W with their micro-batch and chunk, the gradient norm, the optimizer) and
// the communication stream (tid 2: every collective and point-to-point message the comm
// accounting counts, with its axis, bytes and peer). tools/trace_merge.py joins the ranks' files.
//
// How the times are taken: a span on a stream records an ops::Event when it opens and one when it
// closes (CUDA events on a GPU, the host clock on the CPU backend: kernels/ops.h), read after the
// step relative to an event recorded at the step's start, whose host time (the wall clock, so
// that ranks on several nodes line up as well as their clocks do) is the step's origin. A span on
// the host reads the wall clock itself. Each span is also an NVTX range (ops::range_push), so
// Nsight Systems shows the same names. Outside the traced steps a span costs one branch.
//
// Who calls it: train.cu (configure, the step window, the step's phases), parallel/comm.cu (the
// collectives), parallel/pipeline.cu (the actions), checkpoint/ (the save phases). It sits in
// kernels/ because every layer above the seam may use it and it uses only the seam.
#pragma once
#include <string>

#include "kernels/ops.h"

namespace trace {

enum class Lane : int { Host = 0, Compute = 1, Comm = 2 };

// Turns tracing on for steps first..last (1-based, inclusive) of this rank, writing into dir
// (created if missing). compute: the stream the step's origin is recorded on.
void configure(const std::string& dir, int first, int last, int rank, ops::Stream compute);
bool on();               // inside a traced step
void step_begin(int step);
void step_end(int step); // waits for the step's events, rewrites DIR/rank_<r>.json
void shutdown();         // frees the events

// One span, from construction to destruction. `stream` null: host clock (Lane::Host).
class Span {
 public:
  Span(Lane lane, const char* category, const char* name, ops::Stream stream);
  ~Span();
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;
  bool active() const { return index_ >= 0; }
  void name(const std::string& n);                 // replaces the name (no-op when inactive)
  void arg(const char* key, long long value);      // args shown in the viewer's details pane
  void arg(const char* key, const char* value);
  void arg_list(const char* key, const std::string& json);  // a pre-formatted JSON value

 private:
  int index_ = -1;  // in this step's spans; -1 outside a traced step
  ops::Stream stream_ = nullptr;
};

}  // namespace trace
