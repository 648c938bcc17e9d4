// test/gpu/main.cu - runs every registered GPU test (test/gpu/test_*.cu); exit status 1 if any
// check failed. `./build/test_gpu [substring]` runs only the tests whose name contains it.
// GPU_TEST_SEED=N seeds the random inputs (default: a fresh seed, printed); GPU_TEST_EMULATED=1
// says the backend runs on the emulator (see TestContext::emulated).
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <ctime>

#include "test/gpu/harness.h"

namespace {
struct Registered {
  const char* name;
  GpuTestFn fn;
};
std::vector<Registered>& registry() {
  static std::vector<Registered> tests;
  return tests;
}
}  // namespace

int register_gpu_test(const char* name, GpuTestFn fn) {
  registry().push_back({name, fn});
  return (int)registry().size();
}

double check_close(TestContext& ctx, const std::string& what, const float* got, const float* ref,
                   size_t n, double tol) {
  return check_close_floor(ctx, what, got, ref, n, tol, 0.0);
}

double check_close_floor(TestContext& ctx, const std::string& what, const float* got,
                         const float* ref, size_t n, double tol, double floor) {
  double diff = 0, norm = 0;
  bool finite = true;
  for (size_t i = 0; i < n; i++) {
    if (!std::isfinite(got[i])) finite = false;
    double d = (double)got[i] - (double)ref[i];
    diff += d * d;
    norm += (double)ref[i] * ref[i];
  }
  const double scale = std::max(std::sqrt(norm), floor * std::sqrt((double)n));
  double rel = std::sqrt(diff) / (scale + 1e-30);
  bool ok = finite && rel < tol;
  ctx.checks++;
  if (!ok) ctx.failures++;
  std::printf("  %-48s rel err %.3e (tol %.0e) %s\n", what.c_str(), rel, tol,
              ok ? "ok" : (finite ? "FAIL" : "FAIL (non-finite)"));
  return rel;
}

void expect(TestContext& ctx, bool ok, const std::string& what) {
  ctx.checks++;
  if (!ok) ctx.failures++;
  std::printf("  %-48s %s\n", what.c_str(), ok ? "ok" : "FAIL");
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, 4) == 0; }

std::vector<float> random_vector(TestContext& ctx, size_t n, float scale) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(ctx.rng);
  return v;
}

void poison(void* dev, size_t bytes) {
  std::vector<unsigned char> ff(bytes, 0xFF);
  ops::copy_to_device(dev, ff.data(), bytes);
}

std::vector<float> rounded(const std::vector<float>& host, DType dt) {
  std::vector<float> r(host);
  if (dt == DType::BF16)
    for (auto& x : r) x = round_bf16(x);
  return r;
}

void* to_device(const std::vector<float>& host, DType dt) {
  size_t n = host.size();
  void* dev = ops::alloc(n * dtype_size(dt) + 16);
  if (dt == DType::F32) {
    ops::copy_to_device(dev, host.data(), n * 4);
  } else {
    std::vector<uint16_t> h(n);
    for (size_t i = 0; i < n; i++) h[i] = f32_to_bf16(host[i]);
    ops::copy_to_device(dev, h.data(), n * 2);
  }
  return dev;
}

std::vector<float> to_host(const void* dev, size_t n, DType dt) {
  std::vector<float> r(n);
  if (dt == DType::F32) {
    ops::copy_to_host(r.data(), dev, n * 4);
  } else {
    std::vector<uint16_t> h(n);
    ops::copy_to_host(h.data(), dev, n * 2);
    for (size_t i = 0; i < n; i++) r[i] = bf16_to_f32(h[i]);
  }
  return r;
}

int main(int argc, char** argv) {
  const char* filter = argc > 1 ? argv[1] : "";
  DeviceInfo info = ops::device_init(0);
  ref::device_init(0);
  std::printf("GPU tests on %s (%d SMs)\n", info.name, info.multiprocessors);
  TestContext ctx;
  // Fresh inputs every run; GPU_TEST_SEED=N repeats a run's inputs (the seed is printed).
  const char* seed_env = std::getenv("GPU_TEST_SEED");
  const unsigned long long seed =
      seed_env ? std::strtoull(seed_env, nullptr, 10) : std::random_device{}();
  ctx.rng.seed(seed);
  std::printf("inputs from seed %llu (GPU_TEST_SEED)\n", seed);
  const char* emulated = std::getenv("GPU_TEST_EMULATED");
  ctx.emulated = emulated && std::strcmp(emulated, "0") != 0;
  if (ctx.emulated) std::printf("emulated device: small shapes, no timings, no cuDNN\n");
  StreamOptions exact;                    // TF32 off: fp32 must match the CPU
  ctx.stream = ops::stream_create(exact);
  ctx.ref_stream = ref::stream_create(exact);
  int ran = 0;
  for (auto& t : registry()) {
    if (!std::strstr(t.name, filter)) continue;
    std::printf("%s\n", t.name);
    const std::clock_t cpu_start = std::clock();  // all threads' processor time, for the suite
    t.fn(ctx);
    std::printf("  (%s: %.1f s of host CPU)\n", t.name,
                double(std::clock() - cpu_start) / CLOCKS_PER_SEC);
    ran++;
  }
  std::printf("%d tests, %d checks, %d failures\n", ran, ctx.checks, ctx.failures);
  return ctx.failures == 0 && ran > 0 ? 0 : 1;
}
