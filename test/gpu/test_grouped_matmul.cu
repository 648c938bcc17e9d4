// test/gpu/test_grouped_matmul.cu - ops::grouped_matmul_forward / grouped_matmul_backward
// (kernels/cuda/grouped_matmul.cu, one launch per GEMM over all groups) against the CPU backend
// (one loop of matmul_* over the groups) and against the CUDA backend's own per-group loop of
// ops::matmul_* (cuBLASLt), which is what the experts ran before.
//
// As in test_matmul.cu the oracle is ref:: in fp32 on the very values the GPU sees (bf16 inputs
// rounded first): tolerances fp32 1e-5, bf16 outputs 1e-2 (their rounding), fp32 gradients
// 1e-3 in bf16 mode. The grouped kernel and cuBLASLt sum in different orders, so the two CUDA
// paths are held to the same tolerances against each other, not to the bit. Measured on the
// emulated tier: fp32 grouped vs CPU 0 (both sum k in order with fmaf) up to 2e-8 (dGELU),
// grouped vs the emulated cuBLASLt loop ~1.2e-7 (fp32) and 2.7e-3 (bf16: one output rounding).
//
// Groups {5, 0, 70, 17}: an empty group, one spanning two row tiles (64), tails. Shapes:
//   awkward (C 37, OC 19)  scalar loads everywhere (widths not multiples of a 16-byte pack)
//   aligned (C 64, OC 96)  16-byte loads, two column tiles of OC
//   large (C 1536, OC 1600)  experts large enough (2 x 30.7 rows x C x OC >= 1.5e8 FLOPs per
//                            group) that the op runs them as a loop of cuBLASLt GEMMs
// Outputs poisoned (NaN) first; gradients start from random values, so "+=" is checked.
#include <string>
#include <vector>

#include "test/gpu/harness.h"

namespace {

const std::vector<int> kRows = {5, 0, 70, 17};
struct GroupedShape {
  int C, OC;
  const char* name;
};
const GroupedShape kGroupedShapes[] = {{37, 19, "awkward"}, {64, 96, "aligned"}};

double out_tol(DType dt) { return dt == DType::F32 ? 1e-5 : 1e-2; }
double grad_tol(DType dt) { return dt == DType::F32 ? 1e-5 : 1e-3; }

struct Owned {
  std::vector<void*> p;
  void* up(const std::vector<float>& h, DType dt) { return p.emplace_back(to_device(h, dt)); }
  void* nan(size_t n, DType dt) {
    void* d = p.emplace_back(ops::alloc(n * dtype_size(dt)));
    poison(d, n * dtype_size(dt));
    return d;
  }
  ~Owned() {
    for (void* d : p) ops::release(d);
  }
};

struct GroupedData {
  int N = 0, G = 0;
  std::vector<float> inp, weight, bias, dout, gelu_input, dw0, db0;
  GroupedData(TestContext& ctx, const GroupedShape& sh, DType dt) {
    G = (int)kRows.size();
    for (int r : kRows) N += r;
    const size_t w = (size_t)G * sh.OC * sh.C;
    inp = rounded(random_vector(ctx, (size_t)N * sh.C), dt);
    weight = rounded(random_vector(ctx, w, 1.0f / std::sqrt((float)sh.C)), dt);
    bias = rounded(random_vector(ctx, (size_t)G * sh.OC, 0.5f), dt);
    dout = rounded(random_vector(ctx, (size_t)N * sh.OC), dt);
    gelu_input = rounded(random_vector(ctx, (size_t)N * sh.C, 1.5f), dt);
    dw0 = random_vector(ctx, w);
    db0 = random_vector(ctx, (size_t)G * sh.OC);
  }
};

// The CUDA backend's per-group loop of matmul_forward (the experts' former path).
void loop_forward(void* out, void* pre, const void* inp, const void* w, const void* b,
                  const GroupedShape& sh, DType dt, ops::Stream s) {
  const size_t e = dtype_size(dt);
  size_t row = 0;
  for (size_t g = 0; g < kRows.size(); g++) {
    const int n = kRows[g];
    if (n > 0)
      ops::matmul_forward((char*)out + row * sh.OC * e, pre ? (char*)pre + row * sh.OC * e : nullptr,
                          (const char*)inp + row * sh.C * e,
                          (const char*)w + g * sh.OC * sh.C * e,
                          b ? (const char*)b + g * sh.OC * e : nullptr, nullptr, n, sh.C, sh.OC,
                          dt, s);
    row += n;
  }
}

void check_forward(TestContext& ctx, const GroupedShape& sh, DType dt, bool bias, bool gelu) {
  GroupedData x(ctx, sh, dt);
  const size_t n_out = (size_t)x.N * sh.OC;
  std::vector<float> want(n_out), want_pre(n_out);
  ref::grouped_matmul_forward(want.data(), gelu ? want_pre.data() : nullptr, x.inp.data(),
                              x.weight.data(), bias ? x.bias.data() : nullptr, kRows.data(), x.G,
                              sh.C, sh.OC, DType::F32, ctx.ref_stream);
  Owned d;
  void *out = d.nan(n_out, dt), *pre = gelu ? d.nan(n_out, dt) : nullptr;
  void *loop_out = d.nan(n_out, dt), *loop_pre = gelu ? d.nan(n_out, dt) : nullptr;
  void *inp = d.up(x.inp, dt), *w = d.up(x.weight, dt), *b = bias ? d.up(x.bias, dt) : nullptr;
  ops::grouped_matmul_forward(out, pre, inp, w, b, kRows.data(), x.G, sh.C, sh.OC, dt, ctx.stream);
  loop_forward(loop_out, loop_pre, inp, w, b, sh, dt, ctx.stream);
  ops::stream_sync(ctx.stream);
  const std::string what = std::string("grouped fwd ") + dtype_name(dt) + " " + sh.name +
                           (bias ? " bias" : "") + (gelu ? " gelu" : "");
  const std::vector<float> got = to_host(out, n_out, dt);
  check_close(ctx, what + " out", got.data(), want.data(), n_out, out_tol(dt));
  check_close(ctx, what + " out vs loop", got.data(), to_host(loop_out, n_out, dt).data(), n_out,
              out_tol(dt));
  if (gelu)
    check_close(ctx, what + " pre_gelu", to_host(pre, n_out, dt).data(), want_pre.data(), n_out,
                out_tol(dt));
}

struct GroupedBackwardCase {
  bool dinp, dweight, dbias, gelu;
  const char* name;
};
const GroupedBackwardCase kCases[] = {{true, true, true, false, "dinp+dw+db"},
                                      {true, false, false, true, "gelu dinp alone"},
                                      {false, true, false, false, "dw alone"},
                                      {false, false, true, false, "db alone"}};

void check_backward(TestContext& ctx, const GroupedShape& sh, DType dt,
                    const GroupedBackwardCase& c) {
  GroupedData x(ctx, sh, dt);
  const size_t n_inp = (size_t)x.N * sh.C;
  std::vector<float> want_dinp(n_inp), want_dw = x.dw0, want_db = x.db0;
  ref::grouped_matmul_backward(c.dinp ? want_dinp.data() : nullptr,
                               c.dweight ? want_dw.data() : nullptr,
                               c.dbias ? want_db.data() : nullptr, x.dout.data(), x.inp.data(),
                               x.weight.data(), c.gelu ? x.gelu_input.data() : nullptr,
                               kRows.data(), x.G, sh.C, sh.OC, DType::F32, ctx.ref_stream);
  Owned d;
  void* dinp = c.dinp ? d.nan(n_inp, dt) : nullptr;
  float* dw = (float*)d.up(x.dw0, DType::F32);
  float* db = (float*)d.up(x.db0, DType::F32);
  ops::grouped_matmul_backward(dinp, c.dweight ? dw : nullptr, c.dbias ? db : nullptr,
                               d.up(x.dout, dt), d.up(x.inp, dt), d.up(x.weight, dt),
                               c.gelu ? d.up(x.gelu_input, dt) : nullptr, kRows.data(), x.G, sh.C,
                               sh.OC, dt, ctx.stream);
  ops::stream_sync(ctx.stream);
  const std::string what =
      std::string("grouped bwd ") + dtype_name(dt) + " " + sh.name + " " + c.name;
  if (c.dinp)
    check_close(ctx, what + " dinp", to_host(dinp, n_inp, dt).data(), want_dinp.data(), n_inp,
                out_tol(dt));
  check_close(ctx, what + " dweight", to_host(dw, x.dw0.size(), DType::F32).data(),
              want_dw.data(), x.dw0.size(), grad_tol(dt));
  check_close(ctx, what + " dbias", to_host(db, x.db0.size(), DType::F32).data(), want_db.data(),
              x.db0.size(), grad_tol(dt));
}

}  // namespace

GPU_TEST(grouped_matmul_forward) {
  for (const GroupedShape& sh : kGroupedShapes)
    for (DType dt : {DType::F32, DType::BF16}) {
      check_forward(ctx, sh, dt, false, false);
      check_forward(ctx, sh, dt, true, false);
      check_forward(ctx, sh, dt, true, true);
    }
}

GPU_TEST(grouped_matmul_large_experts) {  // the op's loop of cuBLASLt GEMMs
  const GroupedShape large{1536, 1600, "large"};
  check_forward(ctx, large, DType::BF16, true, true);
  check_backward(ctx, large, DType::BF16, kCases[0]);
  check_backward(ctx, large, DType::BF16, kCases[1]);
}

GPU_TEST(grouped_matmul_backward) {
  for (const GroupedShape& sh : kGroupedShapes)
    for (DType dt : {DType::F32, DType::BF16})
      for (const GroupedBackwardCase& c : kCases) check_backward(ctx, sh, dt, c);
}
