// test/emu/include/emu_streams.h - how work reaches an emulated stream: the hook between the
// emulated runtime's stream queues (test/emu/streams.cpp) and everything that puts work on a
// stream (kernel launches, copies, the cuBLASLt, cub and NCCL stand-ins).
//
// A piece of work is a function step() that advances it and returns true once it has finished:
// a kernel, a copy or a GEMM finishes at its first step; an NCCL operation posts its MPI
// transfers at the first step and finishes at the step that finds them complete, so that while
// it waits for the other ranks the runtime can run other streams, as a GPU runs them beside it.
// The runtime queues the work on its stream and runs it when the schedule (EMU_STREAMS) says,
// never before the work queued ahead of it on that stream and the events it waits for.
// enqueue_work is weak: the stand-ins' own tests link no runtime, and there submit() runs the
// work at once, to its end.
//
// Stream capture (test/emu/graphs.cpp): work queued on a capturing stream is recorded instead of
// run, and each replay of the graph runs a fresh piece of work made from the record. For work
// that keeps no state between its steps (a kernel, a copy, a GEMM) the recorded closure is
// copied; work with state, or with numbers it must take anew for each run (an NCCL call's
// message serial numbers), is submitted through submit_made with a maker that the runtime calls
// once now, or once per replay when captured.
#pragma once
#include <cuda_runtime.h>

#include <functional>
#include <utility>

namespace emu {

using StreamWork = std::function<bool()>;
using WorkMaker = std::function<StreamWork()>;

// Queues `work` on `stream` (nullptr: the legacy default stream). `what` names it in messages.
void enqueue_work(cudaStream_t stream, const char* what, StreamWork work) __attribute__((weak));

inline void submit(cudaStream_t stream, const char* what, StreamWork work) {
  if (enqueue_work) {
    enqueue_work(stream, what, std::move(work));
    return;
  }
  while (!work()) {
  }
}

// Queues make() on `stream`, or records `make` when the stream captures (graphs.cpp).
void enqueue_made(cudaStream_t stream, const char* what, WorkMaker make) __attribute__((weak));

inline void submit_made(cudaStream_t stream, const char* what, WorkMaker make) {
  if (enqueue_made) {
    enqueue_made(stream, what, std::move(make));
    return;
  }
  submit(stream, what, make());
}

}  // namespace emu
