// kernels/allocator.cpp - Allocator (kernels/allocator.h): ops::alloc and ops::event_create
// behind a switch that only counts, and HostAllocator: ops::alloc_host_pinned behind the same.
#include "kernels/allocator.h"

void* allocate(Allocator& a, size_t bytes) {
  a.bytes += bytes;
  if (a.count_only || bytes == 0) return nullptr;
  void* p = ops::alloc(bytes);
  a.owned.push_back(p);
  return p;
}

void* allocate_zeroed(Allocator& a, size_t bytes, ops::Stream s) {
  void* p = allocate(a, bytes);
  if (p) ops::fill_zero(p, bytes, s);
  return p;
}

ops::Event allocate_event(Allocator& a) {
  if (a.count_only) return nullptr;
  a.events.push_back(ops::event_create());
  return a.events.back();
}

void allocator_free(Allocator& a) {
  for (void* p : a.owned) ops::release(p);
  for (ops::Event e : a.events) ops::event_destroy(e);
  a.owned.clear();
  a.events.clear();
  a.bytes = 0;
}

void* allocate_host(HostAllocator& a, size_t bytes) {
  a.bytes += bytes;
  if (a.count_only || bytes == 0) return nullptr;
  void* p = ops::alloc_host_pinned(bytes);
  a.owned.push_back(p);
  return p;
}

void host_allocator_free(HostAllocator& a) {
  for (void* p : a.owned) ops::release_host_pinned(p);
  a.owned.clear();
  a.bytes = 0;
}
