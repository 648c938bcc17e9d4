// test/emu/emu_internal.h - what the emulator's own files share (kernel code never sees this):
// the fiber that is one emulated GPU thread, the block that schedules its fibers, and the hooks
// between the runtime (runtime.cpp), the launch (launch.cpp), the scheduler (blocks.cpp), the
// warp operations (warps.cpp), shared memory (shared.cpp) and the PTX model (ptx.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "test/emu/include/emu_cuda.h"
#include "test/emu/include/emu_streams.h"

namespace emu {

// Prints "emu: <message>" and where the emulator is (kernel, block, thread), then aborts.
[[noreturn]] void fail(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

// --- fibers (fiber.cpp) ----------------------------------------------------------------------
// A stack with an inaccessible guard page below it, so that an overflow faults.
struct Stack {
  char* base = nullptr;  // lowest usable address
  size_t size = 0;
};
Stack stack_allocate(size_t bytes);
// A suspended context that starts entry() on `stack` at the first switch to *sp.
void fiber_prepare(void** sp, const Stack& stack, void (*entry)());
// Saves the callee-saved registers and the stack pointer into *save and resumes `load`.
extern "C" void emu_fiber_switch(void** save, void* load);
// Installs the fault handler (on an alternate signal stack) that names the kernel, block and
// thread on a crash inside a kernel, and a stack overflow as such. Once per OS thread.
void install_fault_handler();

// --- the emulated threads of a block (blocks.cpp) -------------------------------------------
enum class Order { Forward, Reverse, Random };
struct OrderSpec {
  Order order = Order::Forward;
  uint64_t seed = 0;
  std::string name() const;
};
// EMU_ORDER="forward" (default), "reverse", "random:SEED", or a comma-separated list of them:
// then every launch runs under each order in turn and must leave bitwise the same memory.
std::vector<OrderSpec> orders_from_environment();

enum class Wait { Running, Barrier, Warp, Done };

// One cp.async, queued until its group completes (ptx.cpp).
struct AsyncCopy {
  void* dst;
  const void* src;
  int cp_size, src_size;
  long group;  // -1 while not committed
};

struct Fiber {
  ThreadState state;  // threadIdx and friends, what device code reads
  void* sp = nullptr;
  Stack stack;
  Wait wait = Wait::Done;
  const char* wait_name = "";  // where it waits, for deadlock messages
  const char* wait_file = "";
  int wait_line = 0;
  WarpCall* warp_call = nullptr;
  std::vector<AsyncCopy> copies;
  long next_group = 0;
};

// One shared-memory allocation of the running block.
struct SharedVar {
  const void* key;  // the declaration's key; nullptr for the dynamic shared memory
  char* base;
  size_t bytes;
  size_t window;  // its address in the block's shared window (__cvta_generic_to_shared)
  const char* name;
};

// What a launch gives every block (launch.cpp fills it).
struct Launch {
  Site site;
  LaunchDims dims;
  ThreadBody body;
  const void* args;
  OrderSpec order;
  uint64_t serial;  // launches so far: seeds the random order
};

// The warp operations in flight in one warp: the lanes that have arrived, grouped by operation
// and mask (usually one group; two half-warp shuffles make two), and each lane's call.
struct WarpGroup {
  WarpComplete complete;
  unsigned mask;
  unsigned arrived;
};
struct WarpState {
  WarpCall* lanes[32];
  WarpGroup groups[4];
  int group_count;
};

// The block being run by the current OS thread.
struct Block {
  const Launch* launch = nullptr;
  BlockState state;
  uint64_t linear = 0;  // block index in the grid
  int threads = 0;
  Fiber* fibers = nullptr;
  uint64_t runnable[16] = {};  // bit i: fiber i can run
  int runnable_count = 0, at_barrier = 0, done = 0;
  WarpState warps[32];
  std::mt19937_64 rng;
  std::vector<SharedVar> shared;
  size_t static_shared_bytes = 0;
  size_t window_end = 0;
};

// Runs block `linear` of the launch on this OS thread, every thread to completion.
void run_block(const Launch& launch, uint64_t linear);
// The running fiber and block of this OS thread (null outside a kernel).
Fiber* running_fiber();
Block* running_block();
// Suspends the running fiber (its wait state is already set) until it is made runnable again.
void yield_fiber();
void make_runnable(Block& b, int thread);
// --- shared memory (shared.cpp) ---------------------------------------------------------------
// A block's dynamic shared memory at its start, and all its shared memory freed at its end.
void shared_start(Block& b);
void shared_finish(Block& b);
// Finds the shared allocation holding [p, p + bytes) in the running block, or null.
const SharedVar* find_shared(const void* p, size_t bytes);

// --- runtime (runtime.cpp) -------------------------------------------------------------------
// The live allocations of cudaMalloc (device) and cudaMallocHost (pinned host), for the order
// check's snapshots and the copy checks.
struct Allocation {
  char* base;
  size_t bytes;
};
std::vector<Allocation> device_allocations();
void set_last_error(cudaError_t err);
// --- streams (streams.cpp) --------------------------------------------------------------------
// Whether s is the legacy stream or a live stream; the host waiting for a stream's queued work,
// or for every stream's (each counts as one host synchronisation of `call`, EMU_HOST_SYNCS).
bool valid_stream(cudaStream_t s);
void wait_stream(cudaStream_t s, const char* call);
void wait_device(const char* call);
uint64_t host_synchronisations();
// Stream capture and replay (graphs.cpp), and the queue operations a replay uses (streams.cpp).
bool capture_active();
bool stream_capturing(cudaStream_t s);
bool capture_take(cudaStream_t s, const char* what, const WorkMaker& make);
bool capture_event_record(cudaEvent_t e, cudaStream_t s);
cudaError_t capture_wait_event(cudaStream_t s, cudaEvent_t e, bool* handled);
cudaError_t capture_refuses_event_use(cudaEvent_t e, const char* call);
cudaError_t capture_refuses_host_wait(cudaStream_t s, bool whole_device, const char* call);
cudaError_t capture_refuses_pageable(cudaStream_t s, const char* call);
uint64_t queue_push(cudaStream_t s, const char* what, StreamWork work);  // its end position
void queue_wait(cudaStream_t waiter, cudaStream_t on);  // for everything queued on `on` so far
void queue_wait_position(cudaStream_t waiter, cudaStream_t on, uint64_t position);
// The bytes of dynamic shared memory a kernel may use (48 KiB unless cudaFuncSetAttribute raised
// it), and the device's limits.
int max_dynamic_shared(const void* kernel);
constexpr size_t kStaticSharedLimit = 48 * 1024;
constexpr size_t kSharedPerBlockLimit = 227 * 1024;  // sm_90's opt-in maximum

// --- counts (counts.cpp, EMU_COUNTS) ---------------------------------------------------------
// Whether EMU_COUNTS names a file; a counted launch's start and end (its first order only: the
// order check's reruns are not counted), the mma FLOPs and cp.async reads of the running launch.
bool counts_enabled();
void counts_launch_begin();
void counts_launch_end(const Site& site);
void count_tensor_flops(double flops);
void count_global_read(const void* p, size_t bytes);

// --- PTX (ptx.cpp) ----------------------------------------------------------------------------
// Completes every cp.async the fiber still has queued (at its exit).
void complete_all_copies(Fiber& f);

}  // namespace emu
