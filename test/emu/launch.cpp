// test/emu/launch.cpp - a kernel launch in the emulator: the configuration checks a GPU makes,
// then every block of the grid (blocks.cpp), under one thread order or several.
//
// Checks, as the CUDA runtime makes them: block dimensions (x, y <= 1024, z <= 64, at most 1024
// threads), grid dimensions (x < 2^31, y, z <= 65535, none zero), dynamic shared memory (48 KiB
// unless cudaFuncSetAttribute(cudaFuncAttributeMaxDynamicSharedMemorySize) raised the kernel's
// limit) and the stream. A refused launch runs nothing and sets the error that cudaGetLastError
// returns, so the caller's LAUNCH_CHECK fails as it would on a GPU; the emulator also says why on
// stderr.
//
// Orders (EMU_ORDER, see blocks.cpp for what an order is): with one order each launch runs once.
// With several (EMU_ORDER=forward,reverse) the launch is an order check: the device memory it
// can write (the allocations its pointer arguments point into, or every cudaMalloc and
// cudaMallocHost allocation when that is not known: emu_cuda.h, Reach) is copied before the
// launch, the launch runs under the first order and its result is kept, then for each further
// order the memory is put back as it was before the launch, the launch runs again, and every
// byte must equal the first result. A difference is an error naming the kernel, the two orders, the allocation and the
// first differing offset: some thread read what another wrote without a barrier in between (or a
// warp-synchronous assumption), since the orders differ only in the interleaving of threads
// between synchronisation points. The order also sets the order of the blocks (forward, reverse
// or shuffled) when one OS thread runs them; EMU_THREADS (default: OpenMP's thread count) OS
// threads run blocks in parallel.
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>

#include "test/emu/emu_internal.h"
#include "test/emu/include/emu_streams.h"

namespace emu {

std::string OrderSpec::name() const {
  switch (order) {
    case Order::Forward: return "forward";
    case Order::Reverse: return "reverse";
    case Order::Random: return "random:" + std::to_string(seed);
  }
  return "?";
}

std::vector<OrderSpec> orders_from_environment() {
  std::vector<OrderSpec> orders;
  const char* env = std::getenv("EMU_ORDER");
  std::string list = env && *env ? env : "forward";
  size_t start = 0;
  while (start <= list.size()) {
    size_t end = list.find(',', start);
    if (end == std::string::npos) end = list.size();
    const std::string item = list.substr(start, end - start);
    OrderSpec o;
    if (item == "forward") {
      o.order = Order::Forward;
    } else if (item == "reverse") {
      o.order = Order::Reverse;
    } else if (item.rfind("random:", 0) == 0 && item.size() > 7) {
      o.order = Order::Random;
      o.seed = std::strtoull(item.c_str() + 7, nullptr, 10);
    } else {
      std::fprintf(stderr, "emu: EMU_ORDER=%s: each order is forward, reverse or random:SEED\n",
                   list.c_str());
      std::exit(2);
    }
    orders.push_back(o);
    start = end + 1;
  }
  return orders;
}

namespace {

const std::vector<OrderSpec>& configured_orders() {
  static const std::vector<OrderSpec> orders = orders_from_environment();
  return orders;
}

int worker_threads() {
  static const int n = [] {
    const char* env = std::getenv("EMU_THREADS");
    int t = env ? std::atoi(env) : omp_get_max_threads();
    return t < 1 || counts_enabled() ? 1 : t;  // counts.cpp counts on one OS thread
  }();
  return n;
}

// Why a GPU would refuse this launch, or null.
const char* refusal(const LaunchDims& d, const void* kernel, cudaError_t* err) {
  *err = cudaErrorInvalidConfiguration;
  const unsigned long threads = (unsigned long)d.block.x * d.block.y * d.block.z;
  if (d.block.x == 0 || d.block.y == 0 || d.block.z == 0) return "a block dimension is zero";
  if (d.block.x > 1024 || d.block.y > 1024 || d.block.z > 64 || threads > 1024)
    return "more than 1024 threads per block (or x, y > 1024, z > 64)";
  if (d.grid.x == 0 || d.grid.y == 0 || d.grid.z == 0) return "a grid dimension is zero";
  if (d.grid.x > 2147483647u || d.grid.y > 65535 || d.grid.z > 65535)
    return "grid dimensions over (2^31 - 1, 65535, 65535)";
  *err = cudaErrorInvalidValue;
  if (d.smem > (size_t)max_dynamic_shared(kernel))
    return "more dynamic shared memory than the kernel may use (over 48 KiB needs "
           "cudaFuncSetAttribute(cudaFuncAttributeMaxDynamicSharedMemorySize); at most 227 KiB)";
  *err = cudaErrorInvalidResourceHandle;
  if (!valid_stream(d.stream)) return "the stream is not a live stream";
  return nullptr;
}

void run_grid(const Launch& launch) {
  const dim3 g = launch.dims.grid;
  const uint64_t blocks = (uint64_t)g.x * g.y * g.z;
  std::vector<uint64_t> sequence;
  if (launch.order.order == Order::Random) {
    sequence.resize(blocks);
    std::iota(sequence.begin(), sequence.end(), uint64_t(0));
    std::mt19937_64 rng(launch.order.seed * 0x9E3779B97F4A7C15ull + launch.serial);
    std::shuffle(sequence.begin(), sequence.end(), rng);
  }
  const bool reverse = launch.order.order == Order::Reverse;
  const int threads = blocks > 1 ? worker_threads() : 1;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (uint64_t i = 0; i < blocks; i++) {
    const uint64_t linear = !sequence.empty() ? sequence[i] : reverse ? blocks - 1 - i : i;
    run_block(launch, linear);
  }
}

struct Snapshot {
  std::vector<Allocation> allocations;
  std::vector<std::vector<char>> bytes;
};

// The allocations the launch can write (all of them when its reach is unknown), and their bytes.
Snapshot take_snapshot(const Reach& reach) {
  Snapshot s;
  for (const Allocation& a : device_allocations()) {
    bool reached = !reach.known;
    for (int i = 0; i < reach.count && !reached; i++) {
      const char* p = static_cast<const char*>(reach.pointers[i]);
      reached = p >= a.base && p <= a.base + a.bytes;
    }
    if (reached) s.allocations.push_back(a);
  }
  for (const Allocation& a : s.allocations) s.bytes.emplace_back(a.base, a.base + a.bytes);
  return s;
}

void restore(const Snapshot& s) {
  for (size_t i = 0; i < s.allocations.size(); i++)
    std::memcpy(s.allocations[i].base, s.bytes[i].data(), s.allocations[i].bytes);
}

void compare(const Snapshot& first, const Launch& launch, const OrderSpec& a, const OrderSpec& b) {
  for (size_t i = 0; i < first.allocations.size(); i++) {
    const Allocation& al = first.allocations[i];
    const char* want = first.bytes[i].data();
    if (std::memcmp(al.base, want, al.bytes) == 0) continue;
    size_t at = 0, count = 0;
    for (size_t k = al.bytes; k-- > 0;)
      if (al.base[k] != want[k]) {
        at = k;
        count++;
      }
    float fa = 0, fb = 0;
    const size_t word = at & ~size_t(3);
    if (word + 4 <= al.bytes) {
      std::memcpy(&fa, want + word, 4);
      std::memcpy(&fb, al.base + word, 4);
    }
    std::fprintf(stderr,
                 "emu: order check failed: kernel %s launched at %s:%d (grid %u,%u,%u block "
                 "%u,%u,%u) leaves different memory under orders %s and %s: %zu bytes of the "
                 "%zu-byte allocation at %p differ, the first at offset %zu (the 4-byte word "
                 "there, as fp32: %.9g under %s, %.9g under %s). Some thread reads what another "
                 "writes without a barrier in between.\n",
                 launch.site.kernel, launch.site.file, launch.site.line, launch.dims.grid.x,
                 launch.dims.grid.y, launch.dims.grid.z, launch.dims.block.x, launch.dims.block.y,
                 launch.dims.block.z, a.name().c_str(), b.name().c_str(), count, al.bytes,
                 (void*)al.base, at, fa, a.name().c_str(), fb, b.name().c_str());
    std::abort();
  }
}

// Runs the launch under the configured order, or each order in turn (the order check).
void run_checked(const Site& site, const LaunchDims& dims, ThreadBody body, const void* args,
                 const Reach& reach) {
  static std::atomic<uint64_t> serial{0};
  Launch launch{site, dims, body, args, OrderSpec{}, serial++};
  const std::vector<OrderSpec>& orders = configured_orders();
  if (orders.size() == 1) {
    launch.order = orders[0];
    counts_launch_begin();  // EMU_COUNTS (counts.cpp): the first order's run is counted
    run_grid(launch);
    counts_launch_end(site);
    return;
  }
  const Snapshot before = take_snapshot(reach);
  launch.order = orders[0];
  counts_launch_begin();
  run_grid(launch);
  counts_launch_end(site);
  const Snapshot first = take_snapshot(reach);
  for (size_t k = 1; k < orders.size(); k++) {
    restore(before);
    launch.order = orders[k];
    run_grid(launch);
    compare(first, launch, orders[0], orders[k]);
  }
}

}  // namespace

void run_kernel(const Site& site, const void* kernel, const LaunchDims& dims, ThreadBody body,
                std::shared_ptr<const void> args, const Reach& reach) {
  cudaError_t err;
  if (const char* why = refusal(dims, kernel, &err)) {
    std::fprintf(stderr, "emu: launch of %s at %s:%d (grid %u,%u,%u block %u,%u,%u, %zu bytes of "
                 "dynamic shared memory) refused: %s\n", site.kernel, site.file, site.line,
                 dims.grid.x, dims.grid.y, dims.grid.z, dims.block.x, dims.block.y, dims.block.z,
                 dims.smem, why);
    set_last_error(err);
    return;
  }
  submit(dims.stream, site.kernel, [site, dims, body, args, reach] {
    run_checked(site, dims, body, args.get(), reach);
    return true;
  });
}

}  // namespace emu
