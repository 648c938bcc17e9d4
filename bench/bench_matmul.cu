// bench/bench_matmul.cu - the GEMMs of a GPT-2 124M and 1.5B layer (B=8, T=1024: N = 8192 rows)
// through ops::matmul_forward / matmul_backward in bf16, as TFLOP/s and as a percentage of the
// 8192^3 GEMM rate measured in the same run.
//
// Each linear layer is timed with the epilogue the trainer uses (model/gpt.cu): qkv and the MLP's
// first layer with a bias (the latter also writing GELU's input and output), the two projections
// with bias + residual, the tied lm_head without bias. FLOPs: forward 2*N*C*OC; backward
// 4*N*C*OC (dinp and dweight; the bias gradient's N*OC adds are not counted). The lm_head's
// backward needs no dinp-side GELU; the MLP projection's backward fuses GELU's derivative.
//
// FP8 ([precision] compute = "fp8", model/fp8.h): for the four block GEMMs, the forward GEMM
// alone on E4M3 operands that are already cast (ops::gemm_fp8, bf16 out), and the whole FP8
// linear forward as the trainer runs it (amax and scale of input and weight, both casts, the
// GEMM, the bias/residual epilogue), each with its speed-up over the bf16 forward of the same
// shape. The issue's target is 1.3x end to end at 1.5B; the GEMM rows show how much of it the
// tensor cores can give and the linear rows what the casts cost.
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

// The FP8 forward of one block linear layer: the GEMM alone, and the whole cast + GEMM path.
void bench_linear_fp8(Bench& b, const ModelShape& m, const Linear& l, double bf16_ms) {
  const size_t N = (size_t)m.B * m.T;
  constexpr DType bf16 = DType::BF16, e4m3 = DType::E4M3;
  void* inp = random_device(b, N * l.C, bf16, 310);
  void* weight = random_device(b, (size_t)l.OC * l.C, bf16, 311, 0.02f);
  void* bias = l.bias ? random_device(b, l.OC, bf16, 312) : nullptr;
  void* residual = l.residual ? random_device(b, N * l.OC, bf16, 313) : nullptr;
  void* x8 = ops::alloc(N * l.C);
  void* w8 = ops::alloc((size_t)l.OC * l.C);
  void* out = ops::alloc(N * l.OC * 2);
  float* state = (float*)random_device(b, 6, DType::F32, 314, 1.0f, true);  // amax, scale, inv x2
  char shape[96];
  std::snprintf(shape, sizeof(shape), "N=%zu C=%d OC=%d", N, l.C, l.OC);
  const std::string name = std::string(m.name) + " " + l.name;
  const double flops = 2.0 * N * l.C * l.OC;
  auto speedup = [&](double ms) {
    char v[48];
    std::snprintf(v, sizeof(v), "%.2fx bf16", bf16_ms / ms);
    return std::string(v);
  };
  double ms = time_op(b, [&](int) {
    ops::gemm_fp8(out, bf16, false, x8, e4m3, w8, e4m3, (int)N, l.OC, l.C, state + 2, state + 5,
                  b.stream);
  });
  add_row(b, BenchRow{"gemm", name + " fp8 gemm", shape, ms, flops / (ms * 1e9), "TFLOP/s",
                      100.0 * flops / (ms * 1e9) / b.gemm_tflops, "", speedup(ms)});
  ms = time_op(b, [&](int) {
    for (int i = 0; i < 2; i++) {  // input, weight: amax, scale, cast
      const void* x = i == 0 ? inp : weight;
      const size_t rows = i == 0 ? N : (size_t)l.OC;
      float* st = state + 3 * i;
      ops::amax(st, x, rows * l.C, bf16, b.stream);
      ops::fp8_update_scale(st + 1, st + 2, nullptr, 0, st, 448.0f, 0, b.stream);
      ops::fp8_cast(i == 0 ? x8 : w8, nullptr, e4m3, x, bf16, (int)rows, l.C, st + 1, b.stream);
    }
    ops::gemm_fp8(out, bf16, false, x8, e4m3, w8, e4m3, (int)N, l.OC, l.C, state + 2, state + 5,
                  b.stream);
    ops::add_bias_residual(out, out, bias, residual, (int)N, l.OC, bf16, b.stream);
  });
  add_row(b, BenchRow{"gemm", name + " fp8 linear fwd", shape, ms, flops / (ms * 1e9), "TFLOP/s",
                      100.0 * flops / (ms * 1e9) / b.gemm_tflops, "", speedup(ms)});
  for (void* p : {inp, weight, bias, residual, x8, w8, out, (void*)state}) ops::release(p);
}

// The bf16 forward time of a layer, from its row.
double forward_ms(const Bench& b, const std::string& name) {
  for (const BenchRow& r : b.rows)
    if (r.name == name) return r.ms;
  return 0;
}

// Mixture of experts (model/moe.cu): E experts' MLPs as one GEMM per expert on its rows (a loop
// of cuBLASLt calls) and as the grouped GEMMs the model runs (ops::grouped_matmul_forward, one
// launch per GEMM), against the same FLOPs as one dense GEMM pair on all the rows. The
// rows are N*top_k pairs spread evenly (a balanced router): E = 8, top_k = 2, hidden 4C each.
void bench_experts(Bench& b, const ModelShape& m) {
  const int E = 8, top_k = 2, C = m.C, D = 4 * C;
  const size_t rows = (size_t)m.B * m.T * top_k, per = rows / E;
  constexpr DType bf16 = DType::BF16;
  void* x = random_device(b, rows * C, bf16, 310);
  void* fc = random_device(b, (size_t)E * D * C, bf16, 311, 0.02f);
  void* proj = random_device(b, (size_t)E * C * D, bf16, 312, 0.02f);
  void* h = ops::alloc(rows * D * 2);
  void* hg = ops::alloc(rows * D * 2);
  void* y = ops::alloc(rows * C * 2);
  const double flops = 2.0 * 2.0 * rows * C * D;
  char shape[96];
  std::snprintf(shape, sizeof(shape), "rows=%zu C=%d D=%d E=%d", rows, C, D, E);
  const double dense = time_op(b, [&](int) {
    ops::matmul_forward(hg, h, x, fc, nullptr, nullptr, (int)rows, C, D, bf16, b.stream);
    ops::matmul_forward(y, nullptr, hg, proj, nullptr, nullptr, (int)rows, D, C, bf16, b.stream);
  });
  report(b, std::string(m.name) + " moe dense-equivalent fwd", shape, flops, dense);
  const double experts = time_op(b, [&](int) {
    for (int e = 0; e < E; e++) {
      const size_t r = e * per;
      char* he = (char*)h + r * D * 2;
      char* hge = (char*)hg + r * D * 2;
      ops::matmul_forward(hge, he, (char*)x + r * C * 2, (char*)fc + (size_t)e * D * C * 2,
                          nullptr, nullptr, (int)per, C, D, bf16, b.stream);
      ops::matmul_forward((char*)y + r * C * 2, nullptr, hge,
                          (char*)proj + (size_t)e * C * D * 2, nullptr, nullptr, (int)per, D, C,
                          bf16, b.stream);
    }
  });
  report(b, std::string(m.name) + " moe per-expert loop fwd", shape, flops, experts);
  const std::vector<int> counts(E, (int)per);  // the same experts as one grouped GEMM each
  const double grouped = time_op(b, [&](int) {
    ops::grouped_matmul_forward(hg, h, x, fc, nullptr, counts.data(), E, C, D, bf16, b.stream);
    ops::grouped_matmul_forward(y, nullptr, hg, proj, nullptr, counts.data(), E, D, C, bf16,
                                b.stream);
  });
  report(b, std::string(m.name) + " moe grouped fwd", shape, flops, grouped);
  for (void* p : {x, fc, proj, h, hg, y}) ops::release(p);
}

}  // namespace

void bench_matmul(Bench& b) {
  for (const ModelShape& m : bench_models(b))
    for (const Linear& l : gpt2_linears(m)) bench_linear(b, m, l);
  if (ops::device_supports_fp8())
    for (const ModelShape& m : bench_models(b))
      for (const Linear& l : gpt2_linears(m))
        if (std::string(l.name) != "lm_head")  // stays bf16 in the fp8 recipe
          bench_linear_fp8(b, m, l, forward_ms(b, std::string(m.name) + " " + l.name + " fwd"));
  for (const ModelShape& m : bench_models(b)) bench_experts(b, m);
  b.notes.push_back(
      "gemm: %ceil = of the bf16 8192^3 rate measured above; bwd = dinp + dweight (+ dbias), "
      "4*N*C*OC FLOPs; no target in the issue; fp8 rows: forward only, speed-up over the bf16 "
      "fwd row of the same layer (gemm = pre-cast operands; linear = amax + scale + casts + gemm "
      "+ epilogue); moe rows: the experts' fc+gelu and proj forward as one GEMM per expert "
      "(8 experts, top-2, balanced) vs one dense GEMM pair of the same FLOPs");
}
