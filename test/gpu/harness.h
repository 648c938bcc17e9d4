// test/gpu/harness.h - a small registry for the GPU tests (make test-gpu). Each test compares a
// CUDA op (ops::) with the CPU oracle (ref::) on fresh random inputs, with outputs poisoned
// (filled with NaN) before the call, and reports the relative error ||got - ref|| / ||ref||.
//
//   GPU_TEST(layernorm_forward_awkward) { ... check_close(ctx, "out", got, ref, n, 1e-5); }
#pragma once
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "kernels/ops.h"
#define ops ref
#include "kernels/ops_decls.h"  // the CPU backend, compiled with -Dops=ref
#undef ops

struct TestContext {
  std::mt19937_64 rng;
  // GPU_TEST_EMULATED=1: the CUDA backend runs on the CPU emulator (test/emu/README.md), which is
  // thousands of times slower than a GPU and has no cuDNN engine. The tests then use smaller
  // stand-ins for their model-sized shapes (the awkward, tail and unaligned sizes stay as they
  // are), skip timings, and do not require cuDNN to run where a GPU's cuDNN would.
  bool emulated = false;
  int failures = 0;
  int checks = 0;
  ops::Stream stream = nullptr;      // CUDA stream (TF32 off)
  ref::Stream ref_stream = nullptr;  // CPU stream
};

typedef void (*GpuTestFn)(TestContext&);
int register_gpu_test(const char* name, GpuTestFn fn);
#define GPU_TEST(name)                                                  \
  static void name(TestContext& ctx);                                   \
  static int registered_##name = register_gpu_test(#name, name);        \
  static void name(TestContext& ctx)

// Relative error of got against ref; records a failure when it is >= tol or not finite.
double check_close(TestContext& ctx, const std::string& what, const float* got, const float* ref,
                   size_t n, double tol);
// The same with the error taken relative to max(||ref||, floor * sqrt(n)), for values whose error
// is absolute rather than relative: a log-sum-exp is a dot product that can cancel to nearly 0
// (T = 1: lse = scale q.k), where a correct kernel and the oracle still differ by an fp32
// rounding of the terms (seen: lse -0.0079845 vs -0.0079844, "relative error" 2.9e-5).
double check_close_floor(TestContext& ctx, const std::string& what, const float* got,
                         const float* ref, size_t n, double tol, double floor);

// Host helpers: random vectors, NaN poisoning of a device buffer, dtype conversions.
std::vector<float> random_vector(TestContext& ctx, size_t n, float scale = 1.0f);
// One named pass/fail check (counted in ctx, printed "ok" or "FAIL"); exact float comparison.
void expect(TestContext& ctx, bool ok, const std::string& what);
bool same_bits(float a, float b);
void poison(void* dev, size_t bytes);  // fills with 0xFF bytes (NaN in fp32 and bf16)
// Device buffer of `host` values stored as dt (bf16: rounded). Caller frees with ops::release.
void* to_device(const std::vector<float>& host, DType dt);
// Device buffer (of dt) back to fp32 host values.
std::vector<float> to_host(const void* dev, size_t n, DType dt);
// Rounds host values as dt would store them (identity for fp32).
std::vector<float> rounded(const std::vector<float>& host, DType dt);

// Average milliseconds of fn over a few runs on stream s (after one warm-up), printed with the
// TFLOP/s that `flops` per run gives.
template <typename Fn>
void report_time(const char* what, double flops, ops::Stream s, Fn&& fn) {
  const int reps = 10;
  fn();
  ops::Event start = ops::event_create(), end = ops::event_create();
  ops::event_record(start, s);
  for (int i = 0; i < reps; i++) fn();
  ops::event_record(end, s);
  ops::event_sync(end);
  const double ms = ops::event_elapsed_ms(start, end) / reps;
  std::printf("  info: %-42s %8.3f ms  %6.1f TFLOP/s\n", what, ms, flops / (ms * 1e9));
  ops::event_destroy(start);
  ops::event_destroy(end);
}
