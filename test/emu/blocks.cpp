// test/emu/blocks.cpp - runs one thread block: its threads as fibers that switch only at
// synchronisation points, in a chosen order.
//
// Scheduling. Every thread of the block is a fiber (fiber.cpp). A fiber runs until it reaches
// __syncthreads, a warp operation (__syncwarp, a shuffle, __reduce_*_sync, ldmatrix, mma:
// warps.cpp, ptx.cpp) that is not complete yet, or its end; then control passes straight to the
// next fiber the order picks. The order (EMU_ORDER): forward takes the lowest-numbered runnable
// thread, reverse the highest, random:SEED a random one (seeded by the seed, the launch's serial
// number and the block index, so a run is reproducible). So between two synchronisation points
// the threads run in that order, one after the other: a thread that reads what another writes
// without a barrier in between sees it in one order and not in the other, which the order check
// (launch.cpp) turns into an error.
//
// __syncthreads completes when every thread of the block waits at it, at the same __syncthreads
// (file and line): CUDA leaves a barrier that some threads skip - by a branch or by having
// returned - undefined, and the emulator reports both rather than guess what a GPU would do.
// When no fiber can run and no barrier can complete, the block is deadlocked: the emulator
// prints what every thread waits for (runs of threads, operation, file and line) and aborts -
// never a hang.
#include <pthread.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "test/emu/emu_internal.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define EMU_ASAN 1
#else
#define EMU_ASAN 0
#endif

namespace emu {

__thread ThreadState* current_thread = nullptr;
__thread BlockState* current_block = nullptr;

namespace {

constexpr int kMaxThreads = 1024;

// The fibers of one OS thread, reused from block to block.
struct Worker {
  std::vector<Fiber> fibers = std::vector<Fiber>(kMaxThreads);
  void* scheduler_sp = nullptr;
  Block block;
  Fiber* running = nullptr;
  const void* asan_scheduler_bottom = nullptr;
  size_t asan_scheduler_size = 0;
  void* asan_fake_stack = nullptr;
};
thread_local Worker* this_worker = nullptr;

Worker& worker() {
  if (!this_worker) this_worker = new Worker;  // lives as long as its OS thread's process
  return *this_worker;
}

size_t stack_bytes() {
  static const size_t bytes = [] {
    const char* kb = std::getenv("EMU_STACK_KB");
    return (size_t)(kb ? std::atol(kb) : 256) * 1024;
  }();
  return bytes;
}

// The OS thread's own stack, for AddressSanitizer's fiber annotations.
void scheduler_stack(Worker& w) {
#if EMU_ASAN
  if (w.asan_scheduler_bottom) return;
  pthread_attr_t attr;
  void* bottom = nullptr;
  size_t size = 0;
  if (pthread_getattr_np(pthread_self(), &attr) == 0) {
    pthread_attr_getstack(&attr, &bottom, &size);
    pthread_attr_destroy(&attr);
  }
  w.asan_scheduler_bottom = bottom;
  w.asan_scheduler_size = size;
#else
  (void)w;
#endif
}

// From the scheduler (on the OS thread's stack) into fiber f, until some fiber hands control back.
void switch_to_fiber(Worker& w, Fiber& f) {
  w.running = &f;
  current_thread = &f.state;
#if EMU_ASAN
  __sanitizer_start_switch_fiber(&w.asan_fake_stack, f.stack.base, f.stack.size);
#endif
  emu_fiber_switch(&w.scheduler_sp, f.sp);
#if EMU_ASAN
  __sanitizer_finish_switch_fiber(w.asan_fake_stack, nullptr, nullptr);
#endif
}

int pick(Block& b);

// The running fiber `from` stops (it waits, or has exited): control goes straight to the next
// fiber the order picks, or to the scheduler when none can run (a barrier to release, a
// deadlock, or the end of the block). Fiber-to-fiber switches halve the switches of a warp
// operation. Returns when `from` is resumed.
void leave(Worker& w, Fiber& from, bool exiting) {
  const int next = pick(w.block);
  void* fake = nullptr;
  void** fake_save = exiting ? nullptr : &fake;
  if (next >= 0) {
    Fiber& to = w.fibers[next];
    w.running = &to;
    current_thread = &to.state;
#if EMU_ASAN
    __sanitizer_start_switch_fiber(fake_save, to.stack.base, to.stack.size);
#endif
    emu_fiber_switch(&from.sp, to.sp);
  } else {
    w.running = nullptr;
    current_thread = nullptr;
#if EMU_ASAN
    __sanitizer_start_switch_fiber(fake_save, w.asan_scheduler_bottom, w.asan_scheduler_size);
#endif
    emu_fiber_switch(&from.sp, w.scheduler_sp);
  }
#if EMU_ASAN
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
  (void)fake_save;
}

void fiber_exit(Worker& w, Fiber& f);

// Every fiber starts here: the kernel with the launch's arguments, then the exit.
void fiber_main() {
  Worker& w = worker();
#if EMU_ASAN
  __sanitizer_finish_switch_fiber(nullptr, nullptr, nullptr);
#endif
  w.block.launch->body(w.block.launch->args);
  fiber_exit(w, *w.running);
}

void fiber_exit(Worker& w, Fiber& f) {
  Block& b = w.block;
  f.wait = Wait::Done;
  b.done++;
  complete_all_copies(f);
  const WarpState& warp = b.warps[f.state.warp];
  for (int g = 0; g < warp.group_count; g++)
    if (warp.groups[g].mask >> f.state.lane & 1u) {
      const WarpCall* c = warp.lanes[__builtin_ctz(warp.groups[g].arrived)];
      fail("thread %u exited while lanes of its warp wait for it in %s (%s:%d, mask 0x%08x)",
           f.state.linear, c->name, c->file, c->line, c->mask);
    }
  leave(w, f, true);
  fail("an exited emulated thread was resumed");
}

// --- the runnable set ---------------------------------------------------------------------------
void set_runnable(Block& b, int i) {
  b.runnable[i >> 6] |= uint64_t(1) << (i & 63);
  b.runnable_count++;
}

int take_runnable(Block& b, int i) {
  b.runnable[i >> 6] &= ~(uint64_t(1) << (i & 63));
  b.runnable_count--;
  return i;
}

int pick(Block& b) {
  if (b.runnable_count == 0) return -1;
  const int words = (b.threads + 63) / 64;
  switch (b.launch->order.order) {
    case Order::Forward:
      for (int w = 0; w < words; w++)
        if (b.runnable[w]) return take_runnable(b, w * 64 + __builtin_ctzll(b.runnable[w]));
      break;
    case Order::Reverse:
      for (int w = words - 1; w >= 0; w--)
        if (b.runnable[w]) return take_runnable(b, w * 64 + 63 - __builtin_clzll(b.runnable[w]));
      break;
    case Order::Random: {
      int k = (int)(b.rng() % (uint64_t)b.runnable_count);
      for (int w = 0; w < words; w++) {
        const int n = __builtin_popcountll(b.runnable[w]);
        if (k >= n) {
          k -= n;
          continue;
        }
        uint64_t bits = b.runnable[w];
        for (; k > 0; k--) bits &= bits - 1;
        return take_runnable(b, w * 64 + __builtin_ctzll(bits));
      }
      break;
    }
  }
  fail("the runnable set is inconsistent");
}

// --- stalls: a barrier to release, or a deadlock to report --------------------------------------
const char* describe(const Fiber& f, char* buf, size_t n) {
  switch (f.wait) {
    case Wait::Done: return "exited";
    case Wait::Running: return "runnable";
    case Wait::Barrier:
      std::snprintf(buf, n, "waits at __syncthreads (%s:%d)", f.wait_file, f.wait_line);
      return buf;
    case Wait::Warp:
      std::snprintf(buf, n, "waits in %s (%s:%d, mask 0x%08x)", f.wait_name, f.wait_file,
                    f.wait_line, f.warp_call ? f.warp_call->mask : 0u);
      return buf;
  }
  return "?";
}

// "threads 0-31: <state>" for each run of consecutive threads in the same state.
std::string thread_states(const Block& b) {
  std::string out;
  char buf[256], prev_buf[256], line[400];
  int start = 0;
  for (int i = 1; i <= b.threads; i++) {
    const char* prev = describe(b.fibers[i - 1], prev_buf, sizeof(prev_buf));
    const char* cur = i < b.threads ? describe(b.fibers[i], buf, sizeof(buf)) : "";
    if (i < b.threads && std::strcmp(prev, cur) == 0) continue;
    std::snprintf(line, sizeof(line), "\n  threads %d-%d: %s", start, i - 1, prev);
    out += line;
    start = i;
  }
  return out;
}

void release_barrier(Block& b) {
  if (b.done > 0)
    fail("some threads of the block exited before a __syncthreads that the others wait at "
         "(CUDA requires every thread of the block to reach it):%s", thread_states(b).c_str());
  const Fiber* first = nullptr;
  for (int i = 0; i < b.threads; i++) {
    Fiber& f = b.fibers[i];
    if (f.wait != Wait::Barrier) continue;
    if (!first) first = &f;
    if (f.wait_line != first->wait_line || std::strcmp(f.wait_file, first->wait_file) != 0)
      fail("the threads of a block met at different __syncthreads (undefined in CUDA):%s",
           thread_states(b).c_str());
  }
  for (int i = 0; i < b.threads; i++)
    if (b.fibers[i].wait == Wait::Barrier) make_runnable(b, i);
  b.at_barrier = 0;
}

void on_stall(Block& b) {
  if (b.at_barrier > 0 && b.at_barrier + b.done == b.threads) {  // release_barrier checks done
    release_barrier(b);
    return;
  }
  fail("deadlock: no thread of the block can run:%s", thread_states(b).c_str());
}

// --- the block ----------------------------------------------------------------------------------
uint64_t mix(uint64_t x) {  // splitmix64's finaliser
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

void start_block(Worker& w, const Launch& launch, uint64_t linear) {
  Block& b = w.block;
  const dim3 g = launch.dims.grid, d = launch.dims.block;
  b.launch = &launch;
  b.linear = linear;
  b.state.block_idx = make_uint3((unsigned)(linear % g.x), (unsigned)(linear / g.x % g.y),
                                 (unsigned)(linear / g.x / g.y));
  b.state.block_dim = d;
  b.state.grid_dim = g;
  b.threads = (int)(d.x * d.y * d.z);
  b.fibers = w.fibers.data();
  b.runnable_count = b.at_barrier = b.done = 0;
  std::memset(b.runnable, 0, sizeof(b.runnable));
  for (int w = 0; w < (b.threads + 31) / 32; w++) b.warps[w].group_count = 0;
  b.rng.seed(mix(launch.order.seed ^ mix(launch.serial ^ mix(linear))));
  shared_start(b);
  for (int i = 0; i < b.threads; i++) {
    Fiber& f = w.fibers[i];
    if (!f.stack.base) f.stack = stack_allocate(stack_bytes());
#if EMU_ASAN
    __asan_unpoison_memory_region(f.stack.base, f.stack.size);  // frames left by the last block
#endif
    f.state.thread_idx = make_uint3(i % d.x, i / d.x % d.y, i / d.x / d.y);
    f.state.linear = (unsigned)i;
    f.state.lane = (unsigned)i % 32;
    f.state.warp = (unsigned)i / 32;
    f.wait = Wait::Running;
    f.warp_call = nullptr;
    f.copies.clear();
    f.next_group = 0;
    // Stacks are equally sized and page-aligned: without a skew, the same local variable of 32
    // lanes (their WarpCall) would fall into one cache set, and warp operations would thrash.
    Stack skewed = f.stack;
    skewed.size -= (size_t)(i % 64) * 64;
    fiber_prepare(&f.sp, skewed, fiber_main);
    set_runnable(b, i);
  }
}

}  // namespace

void run_block(const Launch& launch, uint64_t linear) {
  Worker& w = worker();
  install_fault_handler();
  scheduler_stack(w);
  Block& b = w.block;
  start_block(w, launch, linear);
  current_block = &b.state;
  while (b.done < b.threads) {
    const int i = pick(b);
    if (i < 0) {
      on_stall(b);
      continue;
    }
    switch_to_fiber(w, w.fibers[i]);
  }
  current_block = nullptr;
  shared_finish(b);
  b.launch = nullptr;
}

Fiber* running_fiber() { return this_worker ? this_worker->running : nullptr; }
Block* running_block() {
  return this_worker && this_worker->block.launch ? &this_worker->block : nullptr;
}

void make_runnable(Block& b, int thread) {
  b.fibers[thread].wait = Wait::Running;
  b.fibers[thread].warp_call = nullptr;
  set_runnable(b, thread);
}

void yield_fiber() {
  Worker& w = worker();
  leave(w, *w.running, false);
}

// --- synchronisation ----------------------------------------------------------------------------
void syncthreads(const char* file, int line) {
  Fiber* f = running_fiber();
  if (!f) fail("__syncthreads (%s:%d) called outside a kernel", file, line);
  f->wait = Wait::Barrier;
  f->wait_name = "__syncthreads";
  f->wait_file = file;
  f->wait_line = line;
  running_block()->at_barrier++;
  yield_fiber();
}

// --- messages -----------------------------------------------------------------------------------
void fail(const char* fmt, ...) {
  char msg[8192];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  std::fprintf(stderr, "emu: %s\n", msg);
  if (const Block* b = running_block()) {
    const Launch& l = *b->launch;
    std::fprintf(stderr, "emu:   in kernel %s launched at %s:%d (grid %u,%u,%u block %u,%u,%u, "
                 "%zu bytes dynamic shared memory, order %s), block (%u,%u,%u)",
                 l.site.kernel, l.site.file, l.site.line, l.dims.grid.x, l.dims.grid.y,
                 l.dims.grid.z, l.dims.block.x, l.dims.block.y, l.dims.block.z, l.dims.smem,
                 l.order.name().c_str(), b->state.block_idx.x, b->state.block_idx.y,
                 b->state.block_idx.z);
    if (const Fiber* f = running_fiber())
      std::fprintf(stderr, ", thread (%u,%u,%u)", f->state.thread_idx.x, f->state.thread_idx.y,
                   f->state.thread_idx.z);
    std::fprintf(stderr, "\n");
  }
  std::fflush(stderr);
  std::abort();
}

}  // namespace emu
