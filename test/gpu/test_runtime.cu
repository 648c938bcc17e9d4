// test/gpu/test_runtime.cu - the CUDA backend's device, memory, stream and event functions.
//
// Each check compares against a value known on the host: allocation bookkeeping against the
// sizes asked for, copies against random bytes (odd sizes, unaligned offsets), fill_zero against
// zeros, stream_scratch's growth and reuse, event ordering between two streams (a copy on one
// stream that waits for a slow copy on the other must see its result), event timing against the
// wall clock, stream_destroy giving back all of a stream's memory, and pinned host memory with
// its asynchronous copies.
#include <chrono>
#include <cstring>

#include "kernels/cuda/cuda_common.cuh"
#include "test/gpu/harness.h"

namespace {

std::vector<unsigned char> random_bytes(TestContext& ctx, size_t n) {
  std::uniform_int_distribution<int> byte(0, 255);
  std::vector<unsigned char> v(n);
  for (auto& b : v) b = (unsigned char)byte(ctx.rng);
  return v;
}

}  // namespace

GPU_TEST(runtime_device) {
  expect(ctx, std::strcmp(ops::backend_name(), "cuda") == 0, "backend_name is cuda");
  expect(ctx, !ops::device_memory_is_host(), "device memory is not host memory");
  DeviceInfo info = ops::device_init(0);  // again: must be harmless
  expect(ctx, info.multiprocessors > 0 && info.total_memory > (size_t(1) << 30) &&
                  std::strlen(info.name) > 0,
         std::string("device info: ") + info.name);
}

GPU_TEST(runtime_memory_accounting) {
  const size_t before = ops::memory_in_use();
  const size_t a_bytes = 3 * (size_t(1) << 20) + 5, b_bytes = 12345;
  void* a = ops::alloc(a_bytes);
  void* b = ops::alloc(b_bytes);
  expect(ctx, a && b && a != b, "alloc returns distinct pointers");
  expect(ctx, ops::memory_in_use() == before + a_bytes + b_bytes, "memory_in_use counts both");
  expect(ctx, ops::memory_peak() >= before + a_bytes + b_bytes, "memory_peak covers both");
  ops::release(a);
  expect(ctx, ops::memory_in_use() == before + b_bytes, "release(a) is subtracted");
  ops::release(b);
  ops::release(nullptr);
  expect(ctx, ops::memory_in_use() == before, "back to the starting amount");
  const size_t peak = ops::memory_peak();
  void* c = ops::alloc(16);
  ops::release(c);
  expect(ctx, ops::memory_peak() == peak, "a small allocation leaves the peak alone");
  void* z = ops::alloc(0);
  expect(ctx, z != nullptr, "alloc(0) gives a valid pointer");
  ops::release(z);
}

GPU_TEST(runtime_copies) {
  const size_t n = 1000003;  // odd
  auto host = random_bytes(ctx, n);
  auto* d = static_cast<unsigned char*>(ops::alloc(n + 64));
  auto* e = static_cast<unsigned char*>(ops::alloc(n + 64));
  ops::copy_to_device(d + 3, host.data(), n);  // unaligned destination
  std::vector<unsigned char> back(n);
  ops::copy_to_host(back.data(), d + 3, n);
  expect(ctx, back == host, "copy_to_device / copy_to_host round trip");

  ops::copy_on_device(e + 1, d + 3, n, ctx.stream);  // async; copy_to_host must wait for it
  std::vector<unsigned char> copied(n);
  ops::copy_to_host(copied.data(), e + 1, n);
  expect(ctx, copied == host, "copy_on_device, then copy_to_host sees it");

  ops::fill_zero(e + 1, n - 2, ctx.stream);
  ops::copy_to_host(copied.data(), e + 1, n);
  bool zeros = copied[n - 1] == host[n - 1] && copied[n - 2] == host[n - 2];
  for (size_t i = 0; i + 2 < n; i++) zeros = zeros && copied[i] == 0;
  expect(ctx, zeros, "fill_zero clears exactly its range");
  ops::release(d);
  ops::release(e);
}

// Pinned host memory and the asynchronous copies optimizer offload uses: zeroed, page-aligned,
// outside memory_in_use; a device-to-host copy has landed once its event is synced, and a host-
// to-device copy from pinned memory queued behind a slow copy lands in stream order.
GPU_TEST(runtime_pinned_copies) {
  const size_t n = 3 * 4096 + 17, before = ops::memory_in_use();
  auto* pin = static_cast<unsigned char*>(ops::alloc_host_pinned(n));
  bool zeroed = ((uintptr_t)pin % 4096) == 0;
  for (size_t i = 0; i < n; i++) zeroed = zeroed && pin[i] == 0;
  expect(ctx, zeroed && ops::memory_in_use() == before,
         "alloc_host_pinned: page-aligned, zeroed, not device memory");
  auto host = random_bytes(ctx, n);
  auto* d = static_cast<unsigned char*>(ops::alloc(n));
  ops::copy_to_device(d, host.data(), n);
  ops::Event done = ops::event_create();
  ops::copy_to_host_async(pin, d, n, ctx.stream);
  ops::event_record(done, ctx.stream);
  ops::event_sync(done);
  expect(ctx, std::memcmp(pin, host.data(), n) == 0, "copy_to_host_async, then event_sync");

  const size_t big = size_t(256) << 20;
  void* slow_a = ops::alloc(big);
  void* slow_b = ops::alloc(big);
  ops::copy_on_device(slow_b, slow_a, big, ctx.stream);  // the copy below queues behind it
  ops::copy_to_device_async(d, pin, n, ctx.stream);
  ops::event_record(done, ctx.stream);
  ops::event_sync(done);
  std::vector<unsigned char> back(n);
  ops::copy_to_host(back.data(), d, n);
  expect(ctx, back == host, "copy_to_device_async from pinned memory");
  ops::release(slow_a);
  ops::release(slow_b);
  ops::release(d);
  ops::event_destroy(done);
  ops::release_host_pinned(pin);
  ops::release_host_pinned(nullptr);
}

GPU_TEST(runtime_stream_scratch) {
  ops::Stream s = ops::stream_create(StreamOptions{});
  void* small = ops::stream_scratch(s, 1000);
  expect(ctx, small != nullptr && s->scratch_bytes == (size_t(1) << 20),
         "scratch of 1000 bytes: one whole MiB");
  expect(ctx, ops::stream_scratch(s, 10) == small, "a smaller request reuses the buffer");
  const size_t big = 40 * (size_t(1) << 20) + 1;
  void* grown = ops::stream_scratch(s, big);
  expect(ctx, s->scratch_bytes == 41 * (size_t(1) << 20) && s->scratch == grown,
         "40 MiB + 1 grows it to 41 MiB: the request in whole MiB (what the planner counts)");
  const size_t in_use = ops::memory_in_use();
  ops::stream_scratch(s, 41 * (size_t(1) << 20));
  expect(ctx, ops::memory_in_use() == in_use, "a request of exactly its size reuses it");
  void* again = ops::stream_scratch(s, 50 * (size_t(1) << 20));
  expect(ctx, s->scratch_bytes == 50 * (size_t(1) << 20) && s->scratch == again &&
         ops::memory_in_use() == in_use + 9 * (size_t(1) << 20),
         "then 50 MiB: 50 MiB, the old buffer freed (not doubled to 82 MiB: the final size "
         "depends on the largest request only)");
  // The grown buffer is usable over its whole length.
  ops::fill_zero(grown, big, s);
  std::vector<unsigned char> tail(1, 0xAB);
  ops::copy_to_host(tail.data(), static_cast<char*>(grown) + big - 1, 1);
  expect(ctx, tail[0] == 0, "the grown scratch is writable to its last byte");
  expect(ctx, std::strcmp(ops::attention_impl_name(s), "auto") == 0,
         "attention_impl_name before any attention op");
  ops::stream_destroy(s);
}

GPU_TEST(runtime_stream_destroy_frees) {
  const size_t before = ops::memory_in_use();
  ops::Stream s = ops::stream_create(StreamOptions{});
  expect(ctx, s->workspace != nullptr && s->workspace_bytes >= (size_t(32) << 20) && s->lt,
         "stream has a cuBLASLt handle and a 32 MiB workspace");
  ops::stream_scratch(s, 5 << 20);
  ops::stream_destroy(s);
  expect(ctx, ops::memory_in_use() == before, "stream_destroy releases workspace and scratch");
}

// Stream a copies a large buffer (slow), records an event; stream b waits for it and then copies
// the result onward. Without the wait b would read the destination before a has written it.
GPU_TEST(runtime_events) {
  ops::range_push("runtime_events");
  ops::Stream a = ops::stream_create(StreamOptions{});
  ops::Stream b = ops::stream_create(StreamOptions{});
  const size_t n = size_t(256) << 20;
  auto* src = static_cast<unsigned char*>(ops::alloc(n));
  auto* mid = static_cast<unsigned char*>(ops::alloc(n));
  auto* dst = static_cast<unsigned char*>(ops::alloc(n));
  auto marker = random_bytes(ctx, 4096);
  ops::fill_zero(mid, n, a);
  ops::fill_zero(dst, n, a);
  ops::copy_to_device(src, marker.data(), marker.size());  // src = marker, then garbage
  ops::copy_to_device(src + n - marker.size(), marker.data(), marker.size());

  ops::Event start = ops::event_create(), copied = ops::event_create();
  ops::event_record(start, a);
  for (int i = 0; i < 4; i++) ops::copy_on_device(mid, src, n, a);  // ~1 ms of work
  ops::event_record(copied, a);
  ops::stream_wait_event(b, copied);
  ops::copy_on_device(dst + n - marker.size(), mid + n - marker.size(), marker.size(), b);
  ops::stream_sync(b);
  std::vector<unsigned char> got(marker.size());
  ops::copy_to_host(got.data(), dst + n - marker.size(), marker.size());
  expect(ctx, got == marker, "stream_wait_event orders b after a");

  ops::event_sync(copied);
  const float ms = ops::event_elapsed_ms(start, copied);
  expect(ctx, std::isfinite(ms) && ms > 0.0f && ms < 10000.0f, "event_elapsed_ms of 1 GiB copied");

  // Timing agrees with the host clock for a longer piece of work.
  auto t0 = std::chrono::steady_clock::now();
  ops::event_record(start, a);
  for (int i = 0; i < 40; i++) ops::copy_on_device(mid, src, n, a);
  ops::event_record(copied, a);
  ops::stream_sync(a);
  const double host_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const float dev_ms = ops::event_elapsed_ms(start, copied);
  char what[96];
  std::snprintf(what, sizeof(what), "event time %.2f ms <= host time %.2f ms", dev_ms, host_ms);
  expect(ctx, dev_ms > 0.0f && dev_ms <= host_ms * 1.01 + 0.1, what);

  // event_done (the NCCL watchdog's poll) does not wait: an event never recorded is done; one
  // behind ~10 GiB of copies is not yet, on a GPU, right after they are queued (the emulator runs
  // copies as they are queued); after event_sync it is.
  ops::Event fresh = ops::event_create();
  expect(ctx, ops::event_done(fresh), "event_done of an event never recorded");
  for (int i = 0; i < 40; i++) ops::copy_on_device(mid, src, n, a);
  ops::event_record(copied, a);
  const bool done_at_once = ops::event_done(copied);
  expect(ctx, ctx.emulated || !done_at_once, "event_done behind 10 GiB of copies: not yet");
  ops::event_sync(copied);
  expect(ctx, ops::event_done(copied), "event_done after event_sync");
  ops::event_destroy(fresh);

  ops::event_destroy(start);
  ops::event_destroy(copied);
  for (void* p : {(void*)src, (void*)mid, (void*)dst}) ops::release(p);
  ops::stream_destroy(a);
  ops::stream_destroy(b);
  ops::range_pop();
}
