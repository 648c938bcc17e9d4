// test/gpu/test_matmul.cu - ops::matmul_forward and ops::matmul_backward (kernels/cuda/matmul.cu,
// cuBLASLt) against the CPU backend.
//
// The oracle is ref:: (the CPU backend) in fp32, fed the very values the GPU sees: in bf16 runs
// the inputs are rounded to bf16 first, so the only differences left are the GPU's rounding of
// its bf16 outputs (tolerance 1e-2) and summation order. fp32 runs use a stream with TF32 off and
// must agree to 1e-5. Weight and bias gradients are fp32 in both modes; in bf16 mode they come
// from exact bf16 products summed in fp32, so they are held to 1e-3.
//
// The shapes walk every path of matmul.cu:
//   awkward (N=15, C=37, OC=19)  nothing a multiple of 8: plain GEMMs + hand-written epilogues,
//                                scalar bias-gradient kernel with one row chunk
//   mixed   (1000, 36, 264)      fused forward epilogues (OC % 8 == 0) but hand-written dGELU and
//                                bias gradient (C % 8 != 0): 16-byte paths, 32 row chunks
//   gpt2    (64, 768, 2304)      the QKV layer: every epilogue fused in cuBLASLt
//   lmhead  (256, 64, 1024)      the tied classifier over a padded vocabulary
// Outputs are poisoned (NaN) before each call; gradients start from random values, so "+=" is
// checked, not just "=".
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "test/gpu/harness.h"

namespace {

struct Shape {
  int N, C, OC;
  const char* name;
};
const Shape kShapes[] = {{15, 37, 19, "awkward"},
                         {1000, 36, 264, "mixed"},
                         {64, 768, 2304, "gpt2"},
                         {256, 64, 1024, "lmhead"}};
const DType kDtypes[] = {DType::F32, DType::BF16};

double output_tol(DType dt) { return dt == DType::F32 ? 1e-5 : 1e-2; }
double grad_tol(DType dt) { return dt == DType::F32 ? 1e-5 : 1e-3; }

// Device buffers of one test case, released together.
struct DeviceBuffers {
  std::vector<void*> owned;
  void* upload(const std::vector<float>& host, DType dt) {
    owned.push_back(to_device(host, dt));
    return owned.back();
  }
  void* poisoned(size_t n, DType dt) {
    owned.push_back(ops::alloc(n * dtype_size(dt)));
    poison(owned.back(), n * dtype_size(dt));
    return owned.back();
  }
  ~DeviceBuffers() {
    for (void* p : owned) ops::release(p);
  }
};

// Random layer inputs, already rounded to what dt stores. Weights scaled by 1/sqrt(C) so that
// pre-activations are O(1) and the GELU is tested across its curved part.
struct LayerData {
  std::vector<float> inp, weight, bias, residual, dout, gelu_input;
  LayerData(TestContext& ctx, const Shape& sh, DType dt) {
    size_t nc = (size_t)sh.N * sh.C, no = (size_t)sh.N * sh.OC;
    inp = rounded(random_vector(ctx, nc), dt);
    weight = rounded(random_vector(ctx, (size_t)sh.OC * sh.C, 1.0f / std::sqrt((float)sh.C)), dt);
    bias = rounded(random_vector(ctx, sh.OC, 0.5f), dt);
    residual = rounded(random_vector(ctx, no), dt);
    dout = rounded(random_vector(ctx, no), dt);
    gelu_input = rounded(random_vector(ctx, nc, 1.5f), dt);
  }
};

std::string label(const char* dir, DType dt, const Shape& sh, const char* variant) {
  return std::string(dir) + " " + dtype_name(dt) + " " + sh.name + " " + variant;
}

struct ForwardCase {
  bool bias, residual, gelu;
  const char* name;
};
const ForwardCase kForwardCases[] = {
    {false, false, false, "plain"}, {true, false, false, "bias"},
    {false, true, false, "residual"}, {true, true, false, "bias+residual"},
    {false, false, true, "gelu"}, {true, false, true, "bias+gelu"}};

void check_forward(TestContext& ctx, ops::Stream stream, const Shape& sh, DType dt,
                   const ForwardCase& fc, double tol) {
  const int N = sh.N, C = sh.C, OC = sh.OC;
  const size_t n_out = (size_t)N * OC;
  LayerData x(ctx, sh, dt);
  std::vector<float> want(n_out), want_pre(n_out);
  ref::matmul_forward(want.data(), fc.gelu ? want_pre.data() : nullptr, x.inp.data(),
                      x.weight.data(), fc.bias ? x.bias.data() : nullptr,
                      fc.residual ? x.residual.data() : nullptr, N, C, OC, DType::F32,
                      ctx.ref_stream);

  DeviceBuffers dev;
  void* out = dev.poisoned(n_out, dt);
  void* pre = fc.gelu ? dev.poisoned(n_out, dt) : nullptr;
  ops::matmul_forward(out, pre, dev.upload(x.inp, dt), dev.upload(x.weight, dt),
                      fc.bias ? dev.upload(x.bias, dt) : nullptr,
                      fc.residual ? dev.upload(x.residual, dt) : nullptr, N, C, OC, dt, stream);
  ops::stream_sync(stream);
  std::string what = label("fwd", dt, sh, fc.name);
  check_close(ctx, what + " out", to_host(out, n_out, dt).data(), want.data(), n_out, tol);
  if (fc.gelu)
    check_close(ctx, what + " pre_gelu", to_host(pre, n_out, dt).data(), want_pre.data(), n_out,
                tol);
}

struct BackwardCase {
  bool dinp, dweight, dbias, gelu;
  const char* name;
};
// The last three: the backward split in two (zero-bubble schedules), input gradient alone, and
// the bias gradient alone.
const BackwardCase kBackwardCases[] = {
    {true, true, false, false, "dinp+dw"},       {true, true, true, false, "dinp+dw+db"},
    {true, true, true, true, "gelu dinp+dw+db"}, {true, true, false, true, "gelu dinp+dw"},
    {false, true, true, false, "no-dinp dw+db"}, {false, true, false, false, "no-dinp dw"},
    {true, false, false, false, "dinp alone"},   {true, false, false, true, "gelu dinp alone"},
    {false, false, true, false, "db alone"}};

void check_backward(TestContext& ctx, const Shape& sh, DType dt, const BackwardCase& bc) {
  const int N = sh.N, C = sh.C, OC = sh.OC;
  const size_t n_inp = (size_t)N * C, n_w = (size_t)OC * C;
  LayerData x(ctx, sh, dt);
  std::vector<float> dweight0 = random_vector(ctx, n_w), dbias0 = random_vector(ctx, OC);
  std::vector<float> want_dinp(n_inp), want_dw = dweight0, want_db = dbias0;
  ref::matmul_backward(bc.dinp ? want_dinp.data() : nullptr, bc.dweight ? want_dw.data() : nullptr,
                       bc.dbias ? want_db.data() : nullptr, x.dout.data(), x.inp.data(),
                       x.weight.data(), bc.gelu ? x.gelu_input.data() : nullptr, N, C, OC,
                       DType::F32, ctx.ref_stream);

  DeviceBuffers dev;
  void* dinp = bc.dinp ? dev.poisoned(n_inp, dt) : nullptr;
  float* dw = (float*)dev.upload(dweight0, DType::F32);
  float* db = (float*)dev.upload(dbias0, DType::F32);
  ops::matmul_backward(dinp, bc.dweight ? dw : nullptr, bc.dbias ? db : nullptr, dev.upload(x.dout, dt),
                       dev.upload(x.inp, dt), dev.upload(x.weight, dt),
                       bc.gelu ? dev.upload(x.gelu_input, dt) : nullptr, N, C, OC, dt,
                       ctx.stream);
  ops::stream_sync(ctx.stream);
  std::string what = label("bwd", dt, sh, bc.name);
  if (bc.dinp)
    check_close(ctx, what + " dinp", to_host(dinp, n_inp, dt).data(), want_dinp.data(), n_inp,
                output_tol(dt));
  check_close(ctx, what + " dweight", to_host(dw, n_w, DType::F32).data(), want_dw.data(), n_w,
              grad_tol(dt));
  // Without dweight or dbias those must be left alone (want_dw, want_db are still dweight0,
  // dbias0 then).
  check_close(ctx, what + " dbias", to_host(db, OC, DType::F32).data(), want_db.data(), OC,
              grad_tol(dt));
}

// dweight and dbias after one backward from zero; used twice to check bitwise repeatability.
void backward_from_zero(const Shape& sh, DType dt, const LayerData& x, std::vector<float>& dw,
                        std::vector<float>& db, ops::Stream stream) {
  DeviceBuffers dev;
  float* d_dw = (float*)dev.upload(std::vector<float>((size_t)sh.OC * sh.C, 0.0f), DType::F32);
  float* d_db = (float*)dev.upload(std::vector<float>(sh.OC, 0.0f), DType::F32);
  ops::matmul_backward(nullptr, d_dw, d_db, dev.upload(x.dout, dt), dev.upload(x.inp, dt),
                       dev.upload(x.weight, dt), nullptr, sh.N, sh.C, sh.OC, dt, stream);
  ops::stream_sync(stream);
  dw = to_host(d_dw, (size_t)sh.OC * sh.C, DType::F32);
  db = to_host(d_db, sh.OC, DType::F32);
}

}  // namespace

GPU_TEST(matmul_forward) {
  for (const Shape& sh : kShapes)
    for (DType dt : kDtypes)
      for (const ForwardCase& fc : kForwardCases)
        check_forward(ctx, ctx.stream, sh, dt, fc, output_tol(dt));
}

// out == residual: the residual is added in place (cuBLASLt's C == D).
GPU_TEST(matmul_forward_residual_in_place) {
  for (const Shape& sh : kShapes)
    for (DType dt : kDtypes) {
      const size_t n_out = (size_t)sh.N * sh.OC;
      LayerData x(ctx, sh, dt);
      std::vector<float> want(n_out);
      ref::matmul_forward(want.data(), nullptr, x.inp.data(), x.weight.data(), x.bias.data(),
                          x.residual.data(), sh.N, sh.C, sh.OC, DType::F32, ctx.ref_stream);
      DeviceBuffers dev;
      void* out = dev.upload(x.residual, dt);
      ops::matmul_forward(out, nullptr, dev.upload(x.inp, dt), dev.upload(x.weight, dt),
                          dev.upload(x.bias, dt), out, sh.N, sh.C, sh.OC, dt, ctx.stream);
      ops::stream_sync(ctx.stream);
      check_close(ctx, label("fwd", dt, sh, "bias+residual in place out"),
                  to_host(out, n_out, dt).data(), want.data(), n_out, output_tol(dt));
    }
}

// A stream that allows TF32: fp32 inputs rounded to a 10-bit mantissa, so ~1e-3 relative.
GPU_TEST(matmul_forward_tf32) {
  StreamOptions tf32;
  tf32.allow_tf32 = true;
  ops::Stream stream = ops::stream_create(tf32);
  for (const Shape& sh : kShapes) {
    check_forward(ctx, stream, sh, DType::F32, kForwardCases[1], 5e-3);  // bias
    check_forward(ctx, stream, sh, DType::F32, kForwardCases[5], 5e-3);  // bias+gelu
  }
  ops::stream_destroy(stream);
}

GPU_TEST(matmul_backward) {
  for (const Shape& sh : kShapes)
    for (DType dt : kDtypes)
      for (const BackwardCase& bc : kBackwardCases) check_backward(ctx, sh, dt, bc);
}

// Same inputs twice: dweight and dbias must be bitwise identical (fused and hand-written paths).
GPU_TEST(matmul_backward_deterministic) {
  for (const Shape& sh : kShapes)
    for (DType dt : kDtypes) {
      LayerData x(ctx, sh, dt);
      std::vector<float> dw1, db1, dw2, db2;
      backward_from_zero(sh, dt, x, dw1, db1, ctx.stream);
      backward_from_zero(sh, dt, x, dw2, db2, ctx.stream);
      bool same = std::memcmp(dw1.data(), dw2.data(), dw1.size() * 4) == 0 &&
                  std::memcmp(db1.data(), db2.data(), db1.size() * 4) == 0;
      ctx.checks++;
      if (!same) ctx.failures++;
      std::printf("  %-48s %s\n", label("bwd", dt, sh, "repeat bitwise").c_str(),
                  same ? "ok" : "FAIL (results differ between runs)");
    }
}
