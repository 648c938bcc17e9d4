// kernels/trace.h - per-rank timelines of chosen steps as Chrome trace-event JSON, which Perfetto
// (ui.perfetto.dev) and chrome://tracing open: `[log] trace = "DIR"`, `trace_steps = [a, b]`.
//
// What: each rank writes DIR/rank_<r>.json, one process per rank (pid = world rank) with three
// threads: the host (tid 0: the step, data loading, checkpoint phases), the compute stream (tid 1:
// pipeline actions F/B/W with their micro-batch and chunk, the gradient norm, the optimizer, and
// inside them the ops) and the communication stream (tid 2: every collective and point-to-point
// message the comm accounting counts, with its axis, bytes and peer; the ops run on that stream). tools/trace_merge.py joins the ranks' files.
//
// How the times are taken: a span on a stream records an ops::Event when it opens and one when it
// closes (CUDA events on a GPU, the host clock on the CPU backend: kernels/ops.h), read after the
// step relative to an event recorded at the step's start, whose host time (the wall clock, so
// that ranks on several nodes line up as well as their clocks do) is the step's origin. A span on
// the host reads the wall clock itself. Each span is also an NVTX range (ops::range_push), so
// Nsight Systems shows the same names. Outside the traced steps a span costs one branch.
//
// Ops: every op of the seam that computes or moves tensors on a stream (kernels/op_spans.h lists
// them: the GEMMs, attention, the norms, the activations, the optimizer, the reductions, the
// copies; not the runtime's streams, events and allocations, which the recorder itself uses) opens
// a span, category "op", named as the op, with its shape arguments and `bytes`: an estimate of
// the memory it moves, every tensor it reads counted once and every tensor it writes once (an
// output it accumulates into or updates in place counts twice), at the sizes its shapes give.
// The span sits on the lane of the op's stream: the compute stream's, or else the comm lane. An
// op that calls another public op (the CUDA GEMM backward adds with add_inplace) is one span: the
// inner op is part of the outer one. Both backends open the same spans (OP_SPAN at each op's top,
// from one table), so a CPU trace lists the ops, shapes and bytes a GPU trace lists.
//
// Who calls it: train.cu (configure, the step window, the step's phases), parallel/comm.cu (the
// collectives), parallel/pipeline.cu (the actions), checkpoint/ (the save phases), the two
// backends (the ops). It sits in kernels/ because every layer above the seam may use it and it
// uses only the seam.
#pragma once
#include <initializer_list>
#include <string>

#include "kernels/ops.h"

namespace trace {

enum class Lane : int { Host = 0, Compute = 1, Comm = 2 };

// Turns tracing on for steps first..last (1-based, inclusive) of this rank, writing into dir
// (created if missing). compute: the stream the step's origin is recorded on.
void configure(const std::string& dir, int first, int last, int rank, ops::Stream compute);

namespace detail {
// Inline variables, so that the backends, which every test program links, need nothing of
// kernels/trace.cpp: without the recorder (the op tests, the kernel benchmark) `inside` stays
// false and the op hooks stay null.
inline bool inside = false;  // set by step_begin, cleared by step_end
struct OpArg {  // a shape argument: any integer (int, size_t, bool) becomes a long long
  template <typename Int>
  OpArg(const char* k, Int v) : key(k), value((long long)v) {}
  const char* key;
  long long value;
};
// Set by configure: open an op's span (returns its index, or -1), close it.
inline int (*op_open)(const char* name, const void* stream, long long bytes,
                      std::initializer_list<OpArg> args) = nullptr;
inline void (*op_close)(int index) = nullptr;
}  // namespace detail

inline bool on() { return detail::inside; }  // inside a traced step
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
};

// One op's span (see "Ops" above), opened by TRACE_OP only inside a traced step.
class OpSpan {
 public:
  OpSpan() = default;
  ~OpSpan() {
    if (index_ >= 0) detail::op_close(index_);
  }
  OpSpan(const OpSpan&) = delete;
  OpSpan& operator=(const OpSpan&) = delete;
  void open(const char* name, const void* stream, long long bytes,
            std::initializer_list<detail::OpArg> args) {
    if (detail::op_open) index_ = detail::op_open(name, stream, bytes, args);
  }

 private:
  int index_ = -1;
};

}  // namespace trace

// The first line of an op: TRACE_OP("matmul_forward", s, bytes, {"N", N}, {"C", C}). Outside a
// traced step it costs the branch on trace::on(); the bytes and arguments are not evaluated.
#define TRACE_OP(name, stream, bytes, ...)                                                   \
  trace::OpSpan trace_op_span_;                                                               \
  if (trace::on())                                                                            \
  trace_op_span_.open(name, (const void*)(stream), (long long)(bytes), {__VA_ARGS__})
