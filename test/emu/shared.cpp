// test/emu/shared.cpp - shared memory of the emulated blocks: each __shared__ variable is its own
// host allocation of exactly its size, made when the block's first thread reaches the declaration
// (the rewriter turns the declaration into a call of static_shared with a key unique to it), and
// the dynamic shared memory is one allocation of exactly the launch's bytes. All start as 0xFF
// bytes (NaN as fp32 and bf16) and are freed when the block ends, so a read of memory no thread
// wrote shows, and with AddressSanitizer an index past a variable's end is reported.
// Limits as sm_90 has them: 48 KiB of static shared memory per kernel, 227 KiB in all per block.
// Each allocation also has an address in a 32-bit shared window (from 1 KiB up, as sm_90
// reserves the first KiB), which is what __cvta_generic_to_shared returns.
#include <cstdlib>
#include <cstring>

#include "test/emu/emu_internal.h"

namespace emu {

namespace {

constexpr size_t kDynamicAlign = 128;
constexpr size_t kWindowStart = 1024;

char* shared_alloc(size_t bytes, size_t align) {
  void* p = nullptr;
  if (posix_memalign(&p, align < sizeof(void*) ? sizeof(void*) : align, bytes) != 0 ||
      (!p && bytes > 0))
    fail("out of host memory for %zu bytes of shared memory", bytes);
  std::memset(p, 0xFF, bytes);
  return static_cast<char*>(p);
}

}  // namespace

void shared_start(Block& b) {
  b.static_shared_bytes = 0;
  b.window_end = kWindowStart;
  b.shared.clear();
  const size_t smem = b.launch->dims.smem;
  b.shared.push_back({nullptr, shared_alloc(smem, kDynamicAlign), smem, b.window_end, "dynamic"});
  b.window_end += (smem + 15) / 16 * 16;
}

void shared_finish(Block& b) {
  for (SharedVar& v : b.shared) std::free(v.base);
  b.shared.clear();
}

void* static_shared(const void* key, size_t bytes, size_t align, const char* name,
                    const char* file, int line) {
  Block* b = running_block();
  if (!b) fail("__shared__ %s (%s:%d) used outside a kernel", name, file, line);
  for (const SharedVar& v : b->shared)
    if (v.key == key) return v.base;
  b->static_shared_bytes += bytes;
  if (b->static_shared_bytes > kStaticSharedLimit)
    fail("__shared__ %s (%s:%d): %zu bytes of static shared memory in the block, more than the "
         "48 KiB a kernel may declare", name, file, line, b->static_shared_bytes);
  if (b->static_shared_bytes + b->launch->dims.smem > kSharedPerBlockLimit)
    fail("__shared__ %s (%s:%d): %zu static + %zu dynamic bytes of shared memory, more than "
         "sm_90's 227 KiB per block", name, file, line, b->static_shared_bytes,
         b->launch->dims.smem);
  b->window_end = (b->window_end + align - 1) / align * align;
  b->shared.push_back({key, shared_alloc(bytes, align), bytes, b->window_end, name});
  b->window_end += bytes;
  return b->shared.back().base;
}

void* dynamic_shared(size_t align, const char* name, const char* file, int line) {
  Block* b = running_block();
  if (!b) fail("extern __shared__ %s (%s:%d) used outside a kernel", name, file, line);
  if (align > kDynamicAlign)
    fail("extern __shared__ %s (%s:%d) asks for %zu-byte alignment; the emulator gives %zu", name,
         file, line, align, kDynamicAlign);
  return b->shared.front().base;
}

const SharedVar* find_shared(const void* p, size_t bytes) {
  const Block* b = running_block();
  if (!b) return nullptr;
  const char* c = static_cast<const char*>(p);
  for (const SharedVar& v : b->shared)
    if (c >= v.base && c + bytes <= v.base + v.bytes) return &v;
  return nullptr;
}

size_t cvta_generic_to_shared(const void* p, const char* file, int line) {
  const SharedVar* v = find_shared(p, 1);
  if (!v) fail("__cvta_generic_to_shared (%s:%d): %p is not in the block's shared memory", file,
               line, p);
  return v->window + (size_t)(static_cast<const char*>(p) - v->base);
}

void check_launch_bounds(long max_threads, const char* file, int line) {
  const Block* b = running_block();
  if (b && b->threads > max_threads)
    fail("the kernel declares __launch_bounds__(%ld) (%s:%d) but was launched with %d threads "
         "per block: a GPU refuses that launch", max_threads, file, line, b->threads);
}

}  // namespace emu
