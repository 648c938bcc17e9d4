// test/emu/counts.cpp - EMU_COUNTS=path: what each kernel of a run moves and computes, counted
// while the emulator runs it, written as JSON to `path` at exit with a short table on stdout.
//
// Per kernel (by the name its launch site writes and the host function that launches it, e.g.
// "classifier_kernel<S, P> (classifier_forward)"; in a lambda, its file): launches;
// global-memory bytes read and written; the tensor-core FLOPs its mma instructions issue. Per
// library call (cuBLASLt GEMMs, NCCL): calls, FLOPs and bytes by the call's documented semantics
// (include/emu_counts.h; the stand-ins report them). cuDNN never runs here (its stand-in says
// "not supported"), so it has no rows.
//
// How global memory is counted. The emulated kernels are compiled with GCC's -fsanitize=thread
// instrumentation and no sanitizer runtime (emu.mk: EMU_COUNT_FLAGS): every load and store of
// kernel code calls __tsan_{read,write}N(address), defined here. (AddressSanitizer's outline
// calls would be cheaper, but GCC drops the check of a store to an address the same block has
// just checked by a load - an in-place update such as AdamW's would count no writes.) Outside a counted
// launch they return at once (one thread-local flag), which keeps the emulator's speed when
// EMU_COUNTS is unset. Inside one, an access counts when its address lies in a live cudaMalloc
// or cudaMallocHost allocation (shared memory, the fibers' stacks and the kernel's parameters
// do not); cp.async's global reads are counted by ptx.cpp, which performs them. Two measures:
//   - bytes_read / bytes_written: the distinct 32-byte sectors the launch read / wrote, times 32.
//     A GPU moves DRAM in 32-byte sectors; counting each sector once per launch is the traffic if
//     L2 keeps whatever a launch reuses (the lower bound for that access pattern). The roofline
//     (tools/emu_roofline.py) uses these.
//   - accessed_read / accessed_written: the sum of the load and store instructions' sizes, every
//     access counted (what the SMs ask of L1/L2); reuse shows as accessed > bytes.
// An atomic counts as a write (a load as a read). Counting runs the blocks on one OS thread.
//
// Phases: the NVTX ranges the host code pushes (ops::range_push -> nvtxRangePushA, which the
// emulated build routes here: include/emu_cuda.h). Work inside a "step" range and inside a
// "forward", "backward" or "weight" range belongs to the micro-step; the rest of a "step" to the
// optimizer step (gradient norm, AdamW, ...); work outside any step (initialisation, evaluation)
// to "outside". The JSON holds the totals of each phase and their averages per micro-step (the
// number of "forward" ranges inside steps) and per optimizer step (the number of steps).
// Work is attributed when it runs: under the default schedule (EMU_STREAMS=sync) that is when it
// is queued, inside the range that queued it.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "test/emu/emu_internal.h"
#include "test/emu/include/emu_counts.h"

namespace emu {

namespace {

enum Phase { kOutside = 0, kMicroStep = 1, kOptimizer = 2, kPhases = 3 };
const char* const kPhaseNames[kPhases] = {"outside", "micro_step", "optimizer_step"};

struct KernelTotals {
  double launches = 0, bytes_read = 0, bytes_written = 0, accessed_read = 0,
         accessed_written = 0, tensor_flops = 0;
};
struct LibraryTotals {
  double calls = 0, flops = 0, bytes_read = 0, bytes_written = 0, comm_bytes = 0;
};

// One allocation of the running launch, with its sectors touched so far (bit per 32 bytes).
struct Region {
  uintptr_t base, end;
  std::vector<uint64_t> read, written;
};

struct Counter {
  std::string path;
  std::vector<std::string> ranges;  // the NVTX stack
  int steps = 0, micro_steps = 0;
  std::map<std::string, KernelTotals> kernels[kPhases];
  std::map<std::string, LibraryTotals> libraries[kPhases];
  // The launch being counted.
  std::vector<Region> regions;
  size_t last = 0;  // the region of the previous access
  KernelTotals launch;
};

Counter* counter() {
  static Counter* c = [] {
    const char* env = std::getenv("EMU_COUNTS");
    Counter* made = env && *env ? new Counter : nullptr;
    if (made) made->path = env;
    return made;
  }();
  return c;
}

__thread bool counting = false;  // inside a counted launch, on the OS thread that runs its blocks

Phase phase_now(const Counter& c) {
  bool step = false, micro = false;
  for (const std::string& r : c.ranges) {
    step = step || r == "step";
    micro = micro || (step && (r == "forward" || r == "backward" || r == "weight"));
  }
  return micro ? kMicroStep : step ? kOptimizer : kOutside;
}

void mark(std::vector<uint64_t>& bits, uintptr_t first, uintptr_t last) {
  for (uintptr_t s = first; s <= last; s++) bits[s / 64] |= uint64_t(1) << (s % 64);
}

// The region holding [a, a + n), or null (not device memory).
Region* region_of(Counter& c, uintptr_t a) {
  if (c.last < c.regions.size() && a >= c.regions[c.last].base && a < c.regions[c.last].end)
    return &c.regions[c.last];
  auto it = std::upper_bound(c.regions.begin(), c.regions.end(), a,
                             [](uintptr_t x, const Region& r) { return x < r.base; });
  if (it == c.regions.begin()) return nullptr;
  --it;
  if (a >= it->end) return nullptr;
  c.last = (size_t)(it - c.regions.begin());
  return &*it;
}

void record(uintptr_t a, size_t n, bool write) {
  Counter& c = *counter();
  Region* r = region_of(c, a);
  if (!r || n == 0) return;
  std::vector<uint64_t>& bits = write ? r->written : r->read;
  if (bits.empty()) bits.assign((r->end - r->base + 32 * 64 - 1) / (32 * 64), 0);
  const uintptr_t end = std::min<uintptr_t>(a + n, r->end);
  mark(bits, (a - r->base) / 32, (end - 1 - r->base) / 32);
  (write ? c.launch.accessed_written : c.launch.accessed_read) += (double)n;
}

double sector_bytes(const std::vector<uint64_t>& bits) {
  double sectors = 0;
  for (uint64_t w : bits) sectors += __builtin_popcountll(w);
  return sectors * 32;
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char ch : s) {
    if (ch == '"' || ch == '\\') out += '\\';
    out += ch;
  }
  return out + "\"";
}

}  // namespace

bool counts_enabled() { return counter() != nullptr; }

void counts_launch_begin() {
  Counter* c = counter();
  if (!c) return;
  c->regions.clear();
  for (const Allocation& a : device_allocations())
    c->regions.push_back(Region{(uintptr_t)a.base, (uintptr_t)a.base + a.bytes, {}, {}});
  std::sort(c->regions.begin(), c->regions.end(),
            [](const Region& x, const Region& y) { return x.base < y.base; });
  c->last = 0;
  c->launch = KernelTotals{};
  counting = true;
}

void counts_launch_end(const Site& site) {
  Counter* c = counter();
  if (!c) return;
  counting = false;
  std::string name = site.kernel;  // "classifier_kernel<S, P> (classifier_forward)"
  const char* file = std::strrchr(site.file, '/') ? std::strrchr(site.file, '/') + 1 : site.file;
  const bool lambda = !site.function || std::strcmp(site.function, "operator()") == 0;
  name += std::string(" (") + (lambda ? file : site.function) + ")";  // a lambda: its file
  KernelTotals& t = c->kernels[phase_now(*c)][name];
  t.launches += 1;
  for (const Region& r : c->regions) {
    t.bytes_read += sector_bytes(r.read);
    t.bytes_written += sector_bytes(r.written);
  }
  t.accessed_read += c->launch.accessed_read;
  t.accessed_written += c->launch.accessed_written;
  t.tensor_flops += c->launch.tensor_flops;
  c->regions.clear();
}

void count_tensor_flops(double flops) {
  if (counting) counter()->launch.tensor_flops += flops;
}

void count_global_read(const void* p, size_t bytes) {
  if (counting) record((uintptr_t)p, bytes, false);
}

void count_library_call(const LibraryCall& call) {
  Counter* c = counter();
  if (!c) return;
  LibraryTotals& t = c->libraries[phase_now(*c)][call.name];
  t.calls += 1;
  t.flops += call.flops;
  t.bytes_read += call.bytes_read;
  t.bytes_written += call.bytes_written;
  t.comm_bytes += call.comm_bytes;
}

void nvtx_range_push(const char* name) {
  Counter* c = counter();
  if (!c) return;
  const Phase before = phase_now(*c);
  c->ranges.push_back(name ? name : "");
  const Phase after = phase_now(*c);
  c->steps += before == kOutside && after == kOptimizer;  // the outermost "step"
  c->micro_steps += before == kOptimizer && after == kMicroStep && c->ranges.back() == "forward";
}

void nvtx_range_pop() {
  Counter* c = counter();
  if (c && !c->ranges.empty()) c->ranges.pop_back();
}

namespace {

void write_kernels(FILE* f, const std::map<std::string, KernelTotals>& m, double per) {
  const char* sep = "";
  for (const auto& [name, t] : m) {
    std::fprintf(f, "%s\n      %s: {\"launches\": %.17g, \"bytes_read\": %.17g, "
                 "\"bytes_written\": %.17g, \"accessed_read\": %.17g, \"accessed_written\": "
                 "%.17g, \"tensor_flops\": %.17g}", sep, json_string(name).c_str(),
                 t.launches / per, t.bytes_read / per, t.bytes_written / per,
                 t.accessed_read / per, t.accessed_written / per, t.tensor_flops / per);
    sep = ",";
  }
}

void write_libraries(FILE* f, const std::map<std::string, LibraryTotals>& m, double per) {
  const char* sep = "";
  for (const auto& [name, t] : m) {
    std::fprintf(f, "%s\n      %s: {\"calls\": %.17g, \"flops\": %.17g, \"bytes_read\": %.17g, "
                 "\"bytes_written\": %.17g, \"comm_bytes\": %.17g}", sep,
                 json_string(name).c_str(), t.calls / per, t.flops / per, t.bytes_read / per,
                 t.bytes_written / per, t.comm_bytes / per);
    sep = ",";
  }
}

// {"outside": totals, "micro_step": per micro-step, "optimizer_step": per step} or the totals.
void write_phases(FILE* f, const Counter& c, bool averaged) {
  for (int p = 0; p < kPhases; p++) {
    double per = 1;
    if (averaged && p == kMicroStep && c.micro_steps > 0) per = c.micro_steps;
    if (averaged && p == kOptimizer && c.steps > 0) per = c.steps;
    std::fprintf(f, "%s\n    %s: {\"kernels\": {", p ? "," : "", json_string(kPhaseNames[p]).c_str());
    write_kernels(f, c.kernels[p], per);
    std::fprintf(f, "},\n     \"library\": {");
    write_libraries(f, c.libraries[p], per);
    std::fprintf(f, "}}");
  }
}

void print_table(const Counter& c, const std::string& path) {
  std::printf("emu counts: %d step(s), %d micro-step(s) -> %s (bytes: distinct 32-byte sectors "
              "per launch)\n", c.steps, c.micro_steps, path.c_str());
  for (int p = kMicroStep; p <= kOptimizer; p++) {
    const double per = std::max(1, p == kMicroStep ? c.micro_steps : c.steps);
    std::printf("  per %-14s %8s %10s %10s %10s\n", p == kMicroStep ? "micro-step" : "optimizer step",
                "launches", "MB read", "MB written", "GFLOP");
    for (const auto& [name, t] : c.kernels[p])
      std::printf("  %-60.60s %8.1f %10.3f %10.3f %10.4f\n", name.c_str(), t.launches / per,
                  t.bytes_read / per / 1e6, t.bytes_written / per / 1e6, t.tensor_flops / per / 1e9);
    for (const auto& [name, t] : c.libraries[p])
      std::printf("  %-60.60s %8.1f %10.3f %10.3f %10.4f\n", name.c_str(), t.calls / per,
                  t.bytes_read / per / 1e6, t.bytes_written / per / 1e6, t.flops / per / 1e9);
  }
}

}  // namespace

void counts_write() {
  Counter* c = counter();
  if (!c) return;
  std::string path = c->path;
  const char* size = std::getenv("OMPI_COMM_WORLD_SIZE");
  const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
  if (size && rank && std::atoi(size) > 1) path += ".rank" + std::string(rank);
  FILE* f = std::fopen(path.c_str(), "w");
  if (!f) fail("EMU_COUNTS=%s: cannot write %s", c->path.c_str(), path.c_str());
  std::fprintf(f, "{\"steps\": %d, \"micro_steps\": %d,\n  \"bytes\": \"distinct 32-byte sectors "
               "per launch\",\n  \"totals\": {", c->steps, c->micro_steps);
  write_phases(f, *c, false);
  std::fprintf(f, "},\n  \"per_step\": {");
  write_phases(f, *c, true);
  std::fprintf(f, "}}\n");
  std::fclose(f);
  print_table(*c, path);
}

namespace {
// Written at exit, after the trainer's own output.
struct WriteAtExit {
  WriteAtExit() {
    if (counter()) std::atexit(counts_write);
  }
} write_at_exit;
}  // namespace

}  // namespace emu

// The instrumentation's entry points (GCC -fsanitize=thread with function entry/exit off: every
// load and store of the emulated code calls one, and every atomic is one of these calls, which
// must then do the operation). Not in the AddressSanitizer build (it is not instrumented so, and
// its runtime must not meet these names).
#if !defined(__SANITIZE_ADDRESS__)
extern "C" {
#define EMU_COUNT_ACCESS(n)                                                              \
  void __tsan_read##n(void* a) {                                                         \
    if (__builtin_expect(emu::counting, 0)) emu::record((uintptr_t)a, n, false);         \
  }                                                                                      \
  void __tsan_write##n(void* a) {                                                        \
    if (__builtin_expect(emu::counting, 0)) emu::record((uintptr_t)a, n, true);          \
  }                                                                                      \
  void __tsan_unaligned_read##n(void* a) { __tsan_read##n(a); }                          \
  void __tsan_unaligned_write##n(void* a) { __tsan_write##n(a); }
EMU_COUNT_ACCESS(1)
EMU_COUNT_ACCESS(2)
EMU_COUNT_ACCESS(4)
EMU_COUNT_ACCESS(8)
EMU_COUNT_ACCESS(16)
void __tsan_read_range(void* a, size_t n) {
  if (__builtin_expect(emu::counting, 0)) emu::record((uintptr_t)a, n, false);
}
void __tsan_write_range(void* a, size_t n) {
  if (__builtin_expect(emu::counting, 0)) emu::record((uintptr_t)a, n, true);
}
void __tsan_init() {}
void __tsan_func_entry(void*) {}
void __tsan_func_exit() {}
void __tsan_vptr_update(void**, void*) {}
void __tsan_vptr_read(void**) {}
void __tsan_atomic_thread_fence(int) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
void __tsan_atomic_signal_fence(int) { __atomic_signal_fence(__ATOMIC_SEQ_CST); }

// Atomics: done here (sequentially consistent, whatever order was asked: at least as strong); a
// load counts as a read, anything that writes as a write.
#define EMU_ATOMIC_RMW(bits, T, op, builtin)                                             \
  T __tsan_atomic##bits##_##op(volatile T* a, T v, int) {                                \
    __tsan_write##bits##_or_16((void*)a);                                                \
    return builtin((T*)a, v, __ATOMIC_SEQ_CST);                                          \
  }
#define EMU_ATOMICS(bits, T, bytes)                                                      \
  static inline void __tsan_write##bits##_or_16(void* a) { __tsan_write##bytes(a); }     \
  T __tsan_atomic##bits##_load(const volatile T* a, int) {                               \
    __tsan_read##bytes((void*)a);                                                        \
    return __atomic_load_n((const T*)a, __ATOMIC_SEQ_CST);                               \
  }                                                                                      \
  void __tsan_atomic##bits##_store(volatile T* a, T v, int) {                            \
    __tsan_write##bytes((void*)a);                                                       \
    __atomic_store_n((T*)a, v, __ATOMIC_SEQ_CST);                                        \
  }                                                                                      \
  EMU_ATOMIC_RMW(bits, T, exchange, __atomic_exchange_n)                                 \
  EMU_ATOMIC_RMW(bits, T, fetch_add, __atomic_fetch_add)                                 \
  EMU_ATOMIC_RMW(bits, T, fetch_sub, __atomic_fetch_sub)                                 \
  EMU_ATOMIC_RMW(bits, T, fetch_and, __atomic_fetch_and)                                 \
  EMU_ATOMIC_RMW(bits, T, fetch_or, __atomic_fetch_or)                                   \
  EMU_ATOMIC_RMW(bits, T, fetch_xor, __atomic_fetch_xor)                                 \
  EMU_ATOMIC_RMW(bits, T, fetch_nand, __atomic_fetch_nand)                               \
  int __tsan_atomic##bits##_compare_exchange_strong(volatile T* a, T* c, T v, int, int) { \
    __tsan_write##bytes((void*)a);                                                       \
    return __atomic_compare_exchange_n((T*)a, c, v, false, __ATOMIC_SEQ_CST,             \
                                       __ATOMIC_SEQ_CST);                                \
  }                                                                                      \
  int __tsan_atomic##bits##_compare_exchange_weak(volatile T* a, T* c, T v, int, int) {   \
    return __tsan_atomic##bits##_compare_exchange_strong(a, c, v, 0, 0);                 \
  }                                                                                      \
  T __tsan_atomic##bits##_compare_exchange_val(volatile T* a, T c, T v, int, int) {      \
    __tsan_atomic##bits##_compare_exchange_strong(a, &c, v, 0, 0);                       \
    return c;                                                                            \
  }
EMU_ATOMICS(8, char, 1)
EMU_ATOMICS(16, short, 2)
EMU_ATOMICS(32, int, 4)
EMU_ATOMICS(64, long, 8)
}  // extern "C"
#endif
