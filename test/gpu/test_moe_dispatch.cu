// test/gpu/test_moe_dispatch.cu - the mixture-of-experts token movement (CUDA,
// kernels/cuda/moe_dispatch.cu) against the CPU oracle: moe_permute, moe_unpermute_backward,
// moe_combine and moe_combine_backward, fed with the real dispatch plan
// (parallel/expert_dispatch_plan.cu) of a random routing.
//
// Routing: each token picks top_k distinct experts out of E = 8, never experts 1 and 6 (they get
// no tokens). Shapes (N tokens, top_k, C): (1, 1, 1), (7, 2, 5) and (33, 3, 37) on the scalar
// path (C not a multiple of a 16-byte pack), (33, 3, 64) and (257, 2, 768) on the vector path,
// and (65, 2, 64) with every activation pointer one element off 16-byte alignment (scalar path
// again). fp32 and bf16, random normal activations, gates uniform in (0.05, 1). Outputs are
// poisoned with NaN before every call.
// Checks: permute, unpermute_backward, combine and d_expert_out have the same bits as the oracle
// (the contract fixes every rounding: copies, fp32 adds and fmaf in slot order, one rounding to
// the storage type); d_gate at 1e-5 (the dot over C is a warp tree on the GPU, column order on
// the CPU); a second CUDA run gives the same bits (no atomics).
#include <algorithm>
#include <cstring>

#include "parallel/expert_dispatch_plan.h"
#include "test/gpu/harness.h"

namespace {

constexpr int kE = 8, kEp = 2;

struct Shape {
  int N, top_k, C;
  bool misaligned;
};

std::string label(const Shape& s, DType dt, const char* what) {
  char buf[160];
  std::snprintf(buf, sizeof(buf), "moe_dispatch N=%d top_k=%d C=%d%s %s %s", s.N, s.top_k, s.C,
                s.misaligned ? " misaligned" : "", dtype_name(dt), what);
  return buf;
}

// top_k distinct experts per token out of the live ones (all but 1 and 6), uniformly.
std::vector<int> random_routing(TestContext& ctx, int N, int top_k) {
  std::vector<int> live;
  for (int e = 0; e < kE; e++)
    if (e != 1 && e != 6) live.push_back(e);
  std::vector<int> expert;
  for (int n = 0; n < N; n++) {
    std::shuffle(live.begin(), live.end(), ctx.rng);
    expert.insert(expert.end(), live.begin(), live.begin() + top_k);
  }
  return expert;
}

// Host tensors in storage format (fp32 or bf16 bytes), for the oracle.
std::vector<uint8_t> host_storage(const std::vector<float>& x, DType dt) {
  std::vector<uint8_t> b(x.size() * dtype_size(dt));
  for (size_t i = 0; i < x.size(); i++) {
    if (dt == DType::F32) std::memcpy(&b[4 * i], &x[i], 4);
    else { const uint16_t h = f32_to_bf16(x[i]); std::memcpy(&b[2 * i], &h, 2); }
  }
  return b;
}

// A device copy of host bytes, `offset` bytes into a fresh allocation (misaligned on purpose when
// offset is not a multiple of 16). release() takes base.
struct DeviceBuf {
  void* base = nullptr;
  void* p = nullptr;
};
DeviceBuf device_copy(const void* host, size_t bytes, size_t offset) {
  DeviceBuf d;
  d.base = ops::alloc(bytes + offset + 16);
  d.p = (char*)d.base + offset;
  if (bytes > 0) ops::copy_to_device(d.p, host, bytes);
  return d;
}
DeviceBuf device_poisoned(size_t bytes, size_t offset) {
  DeviceBuf d;
  d.base = ops::alloc(bytes + offset + 16);
  d.p = (char*)d.base + offset;
  poison(d.base, bytes + offset + 16);
  return d;
}
std::vector<uint8_t> host_bytes(const DeviceBuf& d, size_t bytes) {
  std::vector<uint8_t> b(bytes);
  if (bytes > 0) ops::copy_to_host(b.data(), d.p, bytes);
  return b;
}

// The inputs of one case, host side.
struct Inputs {
  int N, top_k, C, M;
  std::vector<int> rows, position;
  std::vector<float> gate;
  std::vector<uint8_t> x, eo, dout_m, dout_n;  // storage bytes: (N,C), (M,C), (M,C), (N,C)
};

// The four ops' outputs (storage bytes, d_gate as floats).
struct Outputs {
  std::vector<uint8_t> perm, din, comb, d_eo;
  std::vector<float> d_gate;
};

Inputs make_inputs(TestContext& ctx, const Shape& s, DType dt) {
  Inputs in{s.N, s.top_k, s.C, s.N * s.top_k};
  const std::vector<int> expert = random_routing(ctx, s.N, s.top_k);
  const ExpertDispatchPlan plan = expert_dispatch_plan_build(expert.data(), s.N, s.top_k, kE, kEp);
  for (int i = 0; i < in.M; i++) in.rows.push_back(plan.order[i] / s.top_k);
  in.position = plan.position;
  std::uniform_real_distribution<float> uniform(0.05f, 1.0f);
  for (int p = 0; p < in.M; p++) in.gate.push_back(uniform(ctx.rng));
  in.x = host_storage(random_vector(ctx, (size_t)s.N * s.C), dt);
  in.eo = host_storage(random_vector(ctx, (size_t)in.M * s.C), dt);
  in.dout_m = host_storage(random_vector(ctx, (size_t)in.M * s.C), dt);
  in.dout_n = host_storage(random_vector(ctx, (size_t)s.N * s.C), dt);
  return in;
}

Outputs run_ref(TestContext& ctx, const Inputs& in, DType dt) {
  const size_t es = dtype_size(dt), tok = (size_t)in.N * in.C * es, disp = (size_t)in.M * in.C * es;
  Outputs o{std::vector<uint8_t>(disp, 0xFF), std::vector<uint8_t>(tok, 0xFF),
            std::vector<uint8_t>(tok, 0xFF), std::vector<uint8_t>(disp, 0xFF),
            std::vector<float>(in.M, NAN)};
  ref::moe_permute(o.perm.data(), in.x.data(), in.rows.data(), in.M, in.C, dt, ctx.ref_stream);
  ref::moe_unpermute_backward(o.din.data(), in.dout_m.data(), in.position.data(), in.N, in.top_k,
                              in.C, dt, ctx.ref_stream);
  ref::moe_combine(o.comb.data(), in.eo.data(), in.gate.data(), in.position.data(), in.N,
                   in.top_k, in.C, dt, ctx.ref_stream);
  ref::moe_combine_backward(o.d_eo.data(), o.d_gate.data(), in.dout_n.data(), in.eo.data(),
                            in.gate.data(), in.position.data(), in.N, in.top_k, in.C, dt,
                            ctx.ref_stream);
  return o;
}

Outputs run_cuda(TestContext& ctx, const Inputs& in, DType dt, bool misaligned) {
  const size_t es = dtype_size(dt), off = misaligned ? es : 0;
  const size_t tok = (size_t)in.N * in.C * es, disp = (size_t)in.M * in.C * es;
  const size_t ints = (size_t)in.M * sizeof(int);
  DeviceBuf x = device_copy(in.x.data(), tok, off), eo = device_copy(in.eo.data(), disp, off);
  DeviceBuf dm = device_copy(in.dout_m.data(), disp, off);
  DeviceBuf dn = device_copy(in.dout_n.data(), tok, off);
  DeviceBuf rows = device_copy(in.rows.data(), ints, 0);
  DeviceBuf pos = device_copy(in.position.data(), ints, 0);
  DeviceBuf gate = device_copy(in.gate.data(), in.M * sizeof(float), 0);
  DeviceBuf perm = device_poisoned(disp, off), din = device_poisoned(tok, off);
  DeviceBuf comb = device_poisoned(tok, off), d_eo = device_poisoned(disp, off);
  DeviceBuf d_gate = device_poisoned(in.M * sizeof(float), 0);
  const int* r = (const int*)rows.p;
  const int* ps = (const int*)pos.p;
  const float* g = (const float*)gate.p;
  ops::moe_permute(perm.p, x.p, r, in.M, in.C, dt, ctx.stream);
  ops::moe_unpermute_backward(din.p, dm.p, ps, in.N, in.top_k, in.C, dt, ctx.stream);
  ops::moe_combine(comb.p, eo.p, g, ps, in.N, in.top_k, in.C, dt, ctx.stream);
  ops::moe_combine_backward(d_eo.p, (float*)d_gate.p, dn.p, eo.p, g, ps, in.N, in.top_k, in.C, dt,
                            ctx.stream);
  Outputs o{host_bytes(perm, disp), host_bytes(din, tok), host_bytes(comb, tok),
            host_bytes(d_eo, disp), to_host(d_gate.p, in.M, DType::F32)};
  for (DeviceBuf* b : {&x, &eo, &dm, &dn, &rows, &pos, &gate, &perm, &din, &comb, &d_eo, &d_gate})
    ops::release(b->base);
  return o;
}

bool same_floats(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

void check_shape(TestContext& ctx, const Shape& s, DType dt) {
  const Inputs in = make_inputs(ctx, s, dt);
  const Outputs want = run_ref(ctx, in, dt);
  const Outputs got = run_cuda(ctx, in, dt, s.misaligned);
  expect(ctx, got.perm == want.perm, label(s, dt, "permute: oracle's bits"));
  expect(ctx, got.din == want.din, label(s, dt, "unpermute_backward: oracle's bits"));
  expect(ctx, got.comb == want.comb, label(s, dt, "combine: oracle's bits"));
  expect(ctx, got.d_eo == want.d_eo, label(s, dt, "combine_backward d_expert_out: bits"));
  check_close(ctx, label(s, dt, "combine_backward d_gate"), got.d_gate.data(),
              want.d_gate.data(), in.M, 1e-5);
  const Outputs again = run_cuda(ctx, in, dt, s.misaligned);
  expect(ctx,
         again.perm == got.perm && again.din == got.din && again.comb == got.comb &&
             again.d_eo == got.d_eo && same_floats(again.d_gate, got.d_gate),
         label(s, dt, "a second run gives the same bits"));
}

const Shape kShapes[] = {{1, 1, 1, false},   {7, 2, 5, false},     {33, 3, 37, false},
                         {33, 3, 64, false}, {257, 2, 768, false}, {65, 2, 64, true}};

}  // namespace

GPU_TEST(moe_dispatch) {
  for (DType dt : {DType::F32, DType::BF16})
    for (const Shape& s : kShapes) check_shape(ctx, s, dt);
}
