// test/test_fp8_linear.cpp - an FP8 linear layer's backward under pipelining (model/fp8.cu).
//
// A pipeline runs other micro-batches' forwards between a micro-batch's forward and its
// backward. The backward must cast that micro-batch's input with the input's own scale: here
// micro-batch A (amax about 8) is followed by the forward of micro-batch B (amax about 0.01)
// before A's backward. Checked, on the CPU backend's exact FP8 emulation, with tensorwise
// scaling: A's weight gradient and input gradient are bitwise those of forward(A) + backward(A)
// alone. With B's scale (about 800 times A's), A's input would saturate at the E4M3 maximum and
// the weight gradient would be far off. Prints "ok"/"FAIL" lines; exit status 1 on failure.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "model/fp8.h"
#include "test/check_results.h"

namespace {

const int N = 32, C = 48, OC = 64;

void* upload_bf16(const std::vector<float>& x) {
  std::vector<uint16_t> h(x.size());
  for (size_t i = 0; i < x.size(); i++) h[i] = f32_to_bf16(x[i]);
  void* d = ops::alloc(h.size() * 2);
  ops::copy_to_device(d, h.data(), h.size() * 2);
  return d;
}

std::vector<float> random(std::mt19937& rng, size_t n, float scale) {
  std::normal_distribution<float> g(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = g(rng);
  return v;
}

template <typename T>
std::vector<T> download(const void* d, size_t n) {
  std::vector<T> h(n);
  ops::copy_to_host(h.data(), d, n * sizeof(T));
  return h;
}

struct Grads {
  std::vector<float> dweight;
  std::vector<uint16_t> dinp;
};

// Forward of A, optionally a forward of B in between, then A's backward.
Grads backward_of_a(Fp8Context& f, void* a, void* b, void* w, void* dout, bool forward_b,
                    ops::Stream s) {
  void* out = ops::alloc((size_t)N * OC * 2);
  void* dinp = ops::alloc((size_t)N * C * 2);
  float* dw = (float*)ops::alloc((size_t)OC * C * 4);
  ops::fill_zero(dw, (size_t)OC * C * 4, s);
  fp8_linear_forward(f, 0, out, nullptr, a, w, nullptr, nullptr, N, C, OC, s);
  if (forward_b) fp8_linear_forward(f, 0, out, nullptr, b, w, nullptr, nullptr, N, C, OC, s);
  fp8_linear_backward(f, 0, dinp, dw, nullptr, dout, a, w, nullptr, N, C, OC, s);
  ops::stream_sync(s);
  Grads g{download<float>(dw, (size_t)OC * C), download<uint16_t>(dinp, (size_t)N * C)};
  for (void* p : {out, dinp, (void*)dw}) ops::release(p);
  return g;
}

}  // namespace

int main() {
  ops::device_init(0);
  ops::Stream s = ops::stream_create(StreamOptions{});
  Comm single;  // a group of one: the amaxes are this rank's own
  Fp8Recipe recipe;
  recipe.amax_group = &single;
  Fp8Context f;
  Allocator memory;
  fp8_create(f, recipe, {"linear"}, N, C, OC, memory, s);
  std::mt19937 rng(7);
  void* a = upload_bf16(random(rng, (size_t)N * C, 2.0f));
  void* b = upload_bf16(random(rng, (size_t)N * C, 0.0025f));
  void* w = upload_bf16(random(rng, (size_t)OC * C, 0.05f));
  void* dout = upload_bf16(random(rng, (size_t)N * OC, 0.1f));

  const Grads alone = backward_of_a(f, a, b, w, dout, false, s);
  const Grads interleaved = backward_of_a(f, a, b, w, dout, true, s);
  Results r;
  const bool same_dw = std::memcmp(alone.dweight.data(), interleaved.dweight.data(),
                                   alone.dweight.size() * 4) == 0;
  const bool same_dx = alone.dinp == interleaved.dinp;
  double worst = 0, norm = 0;
  for (size_t i = 0; i < alone.dweight.size(); i++) {
    worst = std::max(worst, (double)std::fabs(alone.dweight[i] - interleaved.dweight[i]));
    norm = std::max(norm, (double)std::fabs(alone.dweight[i]));
  }
  r.check(same_dw, "weight gradient of A with B's forward in between: bitwise that of A alone "
                   "(max |diff| %.3g of max |dW| %.3g)", worst, norm);
  r.check(same_dx, "input gradient of A with B's forward in between: bitwise that of A alone");
  allocator_free(memory);
  for (void* p : {a, b, w, dout}) ops::release(p);
  ops::stream_destroy(s);
  std::printf("test_fp8_linear: %d of %d checks failed\n", r.failures, r.checks);
  return r.exit_status();
}
