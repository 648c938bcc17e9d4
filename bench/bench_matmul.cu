// bench/bench_matmul.cu - the GEMMs of a GPT-2 124M and 1.5B layer (B=8, T=1024: N = 8192 rows)
// through ops::matmul_forward / matmul_backward in bf16, as TFLOP/s and as a percentage of the
// 8192^3 GEMM rate measured in the same run.
//
// Each linear layer is timed with the epilogue the trainer uses (model/gpt.cu): qkv and the MLP's
// first layer with a bias (the latter also writing GELU's input and output), the two projections
// with bias + residual, the tied lm_head without bias. FLOPs: forward 2*N*C*OC; backward
// 4*N*C*OC (dinp and dweight; the bias gradient's N*OC adds are not counted). The lm_head's
// backward needs no dinp-side GELU; the MLP projection's backward fuses GELU's derivative.
#include "bench/bench.h"

namespace {

struct Linear {
  const char* name;
  int C, OC;        // in and out features
  bool bias, residual, gelu_out, gelu_in;  // epilogues (gelu_in: its input came out of a GELU)
};

std::vector<Linear> gpt2_linears(const ModelShape& m) {
  const int C = m.C;
  return {{"attn qkv", C, 3 * C, true, false, false, false},
          {"attn proj", C, C, true, true, false, false},
          {"mlp fc (+gelu)", C, 4 * C, true, false, true, false},
          {"mlp proj", 4 * C, C, true, true, false, true},
          {"lm_head", C, m.Vp, false, false, false, false}};
}

void report(Bench& b, const std::string& name, const std::string& shape, double flops,
            double ms) {
  const double tflops = flops / (ms * 1e9);
  add_row(b, BenchRow{"gemm", name, shape, ms, tflops, "TFLOP/s", 100.0 * tflops / b.gemm_tflops,
                      "", ""});
}

void bench_linear(Bench& b, const ModelShape& m, const Linear& l) {
  const size_t N = (size_t)m.B * m.T;
  constexpr DType bf16 = DType::BF16;
  void* inp = random_device(b, N * l.C, bf16, 300);
  void* weight = random_device(b, (size_t)l.OC * l.C, bf16, 301, 0.02f);
  void* bias = l.bias ? random_device(b, l.OC, bf16, 302) : nullptr;
  void* residual = l.residual ? random_device(b, N * l.OC, bf16, 303) : nullptr;
  void* out = ops::alloc(N * l.OC * 2);
  void* pre_gelu = l.gelu_out ? ops::alloc(N * l.OC * 2) : nullptr;
  void* gelu_input = l.gelu_in ? random_device(b, N * l.C, bf16, 304) : nullptr;
  void* dout = random_device(b, N * l.OC, bf16, 305);
  void* dinp = ops::alloc(N * l.C * 2);
  float* dweight = (float*)random_device(b, (size_t)l.OC * l.C, DType::F32, 306);
  float* dbias = l.bias ? (float*)random_device(b, l.OC, DType::F32, 307) : nullptr;

  char shape[96];
  std::snprintf(shape, sizeof(shape), "N=%zu C=%d OC=%d", N, l.C, l.OC);
  const std::string name = std::string(m.name) + " " + l.name;
  const double flops = 2.0 * N * l.C * l.OC;
  double ms = time_op(b, [&](int) {
    ops::matmul_forward(out, pre_gelu, inp, weight, bias, residual, (int)N, l.C, l.OC, bf16,
                        b.stream);
  });
  report(b, name + " fwd", shape, flops, ms);
  ms = time_op(b, [&](int) {
    ops::matmul_backward(dinp, dweight, dbias, dout, inp, weight, gelu_input, (int)N, l.C, l.OC,
                         bf16, b.stream);
  });
  report(b, name + " bwd", shape, 2 * flops, ms);
  for (void* p : {inp, weight, bias, residual, out, pre_gelu, gelu_input, dout, dinp,
                  (void*)dweight, (void*)dbias})
    ops::release(p);
}

}  // namespace

void bench_matmul(Bench& b) {
  for (const ModelShape& m : bench_models(b))
    for (const Linear& l : gpt2_linears(m)) bench_linear(b, m, l);
  b.notes.push_back(
      "gemm: %ceil = of the bf16 8192^3 rate measured above; bwd = dinp + dweight (+ dbias), "
      "4*N*C*OC FLOPs; no target in the issue");
}
