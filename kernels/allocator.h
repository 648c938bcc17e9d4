// kernels/allocator.h - device memory (and pinned host memory) that can be counted instead of
// allocated.
//
// The model's activations, the parameter store's shards and buffers and the parallelisms' state
// all come from Allocators. A training run allocates (ops::alloc) and frees everything at the end
// with allocator_free. The planner (training/plan.cu) sets count_only and runs the very same
// setup and training step: every request is recorded in `bytes`, nothing is allocated, the
// buffers and events are null, and the step runs on ops::dry_stream(), where every op does
// nothing. So the planner's memory figures are the trainer's own, not a formula beside it.
#pragma once
#include <vector>

#include "kernels/ops.h"

struct Allocator {
  bool count_only = false;  // record sizes, allocate nothing
  size_t bytes = 0;         // everything requested so far
  std::vector<void*> owned;
  std::vector<ops::Event> events;
};

// `bytes` of device memory, not initialised (nullptr when count_only).
void* allocate(Allocator& a, size_t bytes);
// The same, zero-filled on stream s.
void* allocate_zeroed(Allocator& a, size_t bytes, ops::Stream s);
// A device event (nullptr when count_only: a dry stream never records or waits on one).
ops::Event allocate_event(Allocator& a);
// Frees every buffer and event; `bytes` goes back to 0.
void allocator_free(Allocator& a);

// The same for pinned host memory (ops::alloc_host_pinned): the optimizer state that offload
// keeps off the device (parallel/offload.cu). Counted in `bytes` the same way, so the planner
// reports host memory as it reports device memory.
struct HostAllocator {
  bool count_only = false;
  size_t bytes = 0;
  std::vector<void*> owned;
};
// `bytes` of zeroed pinned host memory (nullptr when count_only).
void* allocate_host(HostAllocator& a, size_t bytes);
void host_allocator_free(HostAllocator& a);
