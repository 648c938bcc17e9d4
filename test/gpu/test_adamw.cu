// test/gpu/test_adamw.cu - adamw_update (CUDA) against the CPU oracle.
//
// Sizes: 1, 13 (scalar tail only), 1000, 2^20 + 3 (vector path plus a tail), and 1001 elements
// one past an aligned address (scalar path). Hyper-parameters are not the defaults (step 10,
// weight decay 0.1, gradient scale 0.5) so that every term of the formula matters; m starts
// random and v starts positive. master, m and v are compared with the oracle at 1e-5, and must
// in fact be bitwise equal to it (both backends round PyTorch's operations in the same order,
// without FMA contraction; a mismatch there is reported as its own failed check). The
// working copy is checked without tolerance: fp32 must equal the new master weights bit for
// bit, bf16 must equal them rounded to nearest even (common.h's f32_to_bf16); without a working
// copy the call must not touch anything else. The gradient scale read from device memory
// (AdamWStep::device_grad_scale, the clipping factor as the trainer passes it) must give the bits
// of the same scale passed by value.
#include <cstring>

#include "test/gpu/harness.h"

namespace {

struct Case {
  size_t n;
  size_t offset;  // elements into the allocations: 1 makes every pointer unaligned
};

// Host values as fp32 on the device, `offset` floats into a fresh allocation (see base).
float* floats_at(const std::vector<float>& host, size_t offset, void** base) {
  std::vector<float> padded(offset, 0.0f);
  padded.insert(padded.end(), host.begin(), host.end());
  *base = to_device(padded, DType::F32);
  return static_cast<float*>(*base) + offset;
}

size_t count_different_bits(const std::vector<float>& a, const std::vector<float>& b) {
  size_t bad = 0;
  for (size_t i = 0; i < a.size(); i++) bad += std::memcmp(&a[i], &b[i], 4) != 0;
  return bad;
}

// The working copy must be exactly the new master weights in param_dt.
void check_working_copy(TestContext& ctx, const std::string& what, const std::vector<float>& got,
                        const std::vector<float>& master, DType param_dt) {
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); i++) {
    float want = param_dt == DType::BF16 ? round_bf16(master[i]) : master[i];
    if (std::memcmp(&got[i], &want, 4) != 0) bad++;
  }
  char buf[64];
  std::snprintf(buf, sizeof(buf), " (%zu of %zu differ)", bad, got.size());
  expect(ctx, bad == 0, what + buf);
}

// param_out: nullptr when has_copy is false, else a buffer of param_dt.
void check_case(TestContext& ctx, const Case& k, bool has_copy, DType param_dt) {
  const size_t n = k.n;
  AdamWStep step{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, 10};
  auto master = random_vector(ctx, n);
  auto grad = random_vector(ctx, n, 3.0f);
  auto m = random_vector(ctx, n, 0.1f);
  auto v = random_vector(ctx, n, 0.1f);
  for (auto& x : v) x = x * x;
  void *master_base, *grad_base, *m_base, *v_base;
  float* d_master = floats_at(master, k.offset, &master_base);
  float* d_grad = floats_at(grad, k.offset, &grad_base);
  float* d_m = floats_at(m, k.offset, &m_base);
  float* d_v = floats_at(v, k.offset, &v_base);
  void* copy_base = nullptr;
  void* d_copy = nullptr;
  if (has_copy) {
    const size_t bytes = (n + k.offset) * dtype_size(param_dt);
    copy_base = ops::alloc(bytes);
    poison(copy_base, bytes);
    d_copy = static_cast<char*>(copy_base) + k.offset * dtype_size(param_dt);
  }

  ops::adamw_update(d_master, d_copy, d_grad, d_m, d_v, n, step, param_dt, ctx.stream);
  std::vector<float> want_master(master), want_m(m), want_v(v);
  ref::adamw_update(want_master.data(), nullptr, grad.data(), want_m.data(), want_v.data(), n,
                    step, DType::F32, ctx.ref_stream);

  char name[96];
  std::snprintf(name, sizeof(name), "adamw n=%zu%s copy=%s", n, k.offset ? " unaligned" : "",
                has_copy ? dtype_name(param_dt) : "none");
  auto got_master = to_host(d_master, n, DType::F32);
  check_close(ctx, std::string(name) + " master", got_master.data(), want_master.data(), n, 1e-5);
  check_close(ctx, std::string(name) + " m", to_host(d_m, n, DType::F32).data(), want_m.data(), n,
              1e-5);
  check_close(ctx, std::string(name) + " v", to_host(d_v, n, DType::F32).data(), want_v.data(), n,
              1e-5);
  const size_t differ = count_different_bits(got_master, want_master);
  char bits[64];
  std::snprintf(bits, sizeof(bits), " master bitwise = CPU (%zu differ)", differ);
  expect(ctx, differ == 0, name + std::string(bits));
  expect(ctx, to_host(d_grad, n, DType::F32) == grad, std::string(name) + " grad untouched");
  if (has_copy)
    check_working_copy(ctx, std::string(name) + " working copy", to_host(d_copy, n, param_dt),
                       got_master, param_dt);
  for (void* p : {master_base, grad_base, m_base, v_base, copy_base}) ops::release(p);
}

const Case kCases[] = {{1, 0}, {13, 0}, {1000, 0}, {(1 << 20) + 3, 0}, {1001, 1}};

}  // namespace

GPU_TEST(adamw_update) {
  for (const Case& k : kCases) {
    check_case(ctx, k, false, DType::F32);
    check_case(ctx, k, true, DType::F32);
    check_case(ctx, k, true, DType::BF16);
  }
}

// The clipping factor from device memory: bitwise the update with the same factor by value.
GPU_TEST(adamw_update_device_grad_scale) {
  const size_t n = 1003;
  AdamWStep by_value{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.37f, 3};
  AdamWStep from_device = by_value;
  from_device.grad_scale = 1.0f;  // ignored: the device's float counts
  const std::vector<float> scale = {0.37f};
  void* d_scale = to_device(scale, DType::F32);
  from_device.device_grad_scale = static_cast<const float*>(d_scale);
  auto master = random_vector(ctx, n);
  auto grad = random_vector(ctx, n, 3.0f);
  std::vector<float> zeros(n, 0.0f);
  std::vector<float> got;
  for (const AdamWStep* step : {&from_device, &by_value}) {
    float* d_master = static_cast<float*>(to_device(master, DType::F32));
    float* d_grad = static_cast<float*>(to_device(grad, DType::F32));
    float* d_m = static_cast<float*>(to_device(zeros, DType::F32));
    float* d_v = static_cast<float*>(to_device(zeros, DType::F32));
    ops::adamw_update(d_master, nullptr, d_grad, d_m, d_v, n, *step, DType::F32, ctx.stream);
    auto out = to_host(d_master, n, DType::F32);
    if (got.empty()) got = out;
    else expect(ctx, count_different_bits(got, out) == 0,
                "adamw: scale from device memory = the same scale by value, bitwise");
    for (void* p : {(void*)d_master, (void*)d_grad, (void*)d_m, (void*)d_v}) ops::release(p);
  }
  ops::release(d_scale);
}
