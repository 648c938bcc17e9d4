// bench/bench_memory.cu - the memory-bound kernels of a GPT-2 step (and Llama's own layers), each as achieved GB/s and as a
// percentage of the copy bandwidth measured in the same run (target: >= 85%).
//
// Bytes per call (s = 2, bf16 activations; N = B*T rows; n elements; U distinct tokens) - the
// fewest bytes each op must move, each input read once and each output written once:
//   encoder_forward     3NCs + 4N             encoder_backward   2NCs + 8TC + 8UC
//   layernorm_forward   2NCs + 2Cs + 8N       layernorm_backward 4NCs + Cs + 8N
//   gelu_forward        2ns (n = 4NC)         gelu_backward      3ns
//   classifier (fused forward + gradient, in place)  NVs + NVps + 8N: the first V columns read
//       once, all Vp columns written once (the kernel's second read of a row comes from L2; if
//       it missed, the traffic would be about 3NVps)
//   adamw_update        28n + 2n (bf16 copy of the weights)    sum_squares 4n
//   add_inplace         12n                   cast               n * (src + dst bytes)
// Llama's layers (Llama-3 8B's shapes: C = 4096, NH = 32, NKV = 8, HS = 128, F = 14336):
//   rmsnorm_forward     2NCs + Cs + 4N        rmsnorm_backward   4NCs + Cs + 4N
//   rope_forward        2N(NH+NKV)HS s + 4T HS (q and k in place; cos and sin rows of T tokens)
//   rope_backward       the same
//   swiglu_forward      3NFs                  swiglu_backward    5NFs
// Shapes: B=8, T=1024 rows of GPT-2 124M (C=768) and 1.5B (C=1600); the optimizer and reduction
// ops over each model's parameter count. Ops whose working set is small rotate over buffer sets
// (bench.h) so that L2 does not serve repeated launches.
#include <string>

#include "bench/bench.h"

namespace {

constexpr DType kBF16 = DType::BF16;
constexpr double kTargetPercent = 85.0;

// Device allocations of one benchmark, released together.
struct Allocs {
  std::vector<void*> live;
  template <typename P>
  P* keep(P* p) {
    live.push_back((void*)p);
    return p;
  }
  ~Allocs() {
    for (void* p : live) ops::release(p);
  }
};

std::string rows_shape(const ModelShape& m) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "B=%d T=%d C=%d", m.B, m.T, m.C);
  return buf;
}

std::string count_shape(const char* what, size_t n) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "n=%zu (%s)", n, what);
  return buf;
}

void report(Bench& b, const std::string& name, const std::string& shape, double bytes, double ms) {
  const double gbps = bytes / (ms * 1e6);
  const double percent = 100.0 * gbps / b.copy_gbps;
  add_row(b, BenchRow{"memory", name, shape, ms, gbps, "GB/s", percent, ">= 85% copy",
                      verdict_at_least(percent, kTargetPercent)});
}

void bench_encoder(Bench& b, const ModelShape& m) {
  const size_t N = (size_t)m.B * m.T, C = m.C;
  const std::string shape = rows_shape(m);
  if (has_row(b, "encoder_forward bf16", shape)) return;
  Allocs a;
  const double fwd_bytes = 3.0 * N * C * 2 + 4.0 * N;
  const int sets = buffer_sets(b, (size_t)fwd_bytes);
  std::vector<int*> tokens(sets);
  std::vector<void*> wte(sets), wpe(sets), out(sets), dout(sets);
  std::vector<float*> dwte(sets), dwpe(sets);
  double distinct_sum = 0;
  for (int i = 0; i < sets; i++) {
    size_t distinct = 0;
    tokens[i] = a.keep(random_tokens(N, m.V, 100 + i, &distinct));
    distinct_sum += distinct;
    wte[i] = a.keep(random_device(b, (size_t)m.Vp * C, kBF16, 10 + i));
    wpe[i] = a.keep(random_device(b, (size_t)m.T * C, kBF16, 20 + i));
    out[i] = a.keep(ops::alloc(N * C * 2));
    dout[i] = a.keep(random_device(b, N * C, kBF16, 30 + i));
    dwte[i] = a.keep((float*)random_device(b, (size_t)m.Vp * C, DType::F32, 40 + i));
    dwpe[i] = a.keep((float*)random_device(b, (size_t)m.T * C, DType::F32, 50 + i));
  }
  double ms = time_op(b, [&](int l) {
    const int i = l % sets;
    ops::encoder_forward(out[i], tokens[i], wte[i], wpe[i], m.B, m.T, m.C, kBF16, b.stream);
  });
  report(b, "encoder_forward bf16", shape, fwd_bytes, ms);
  const double U = distinct_sum / sets;
  const double bwd_bytes = 2.0 * N * C * 2 + 8.0 * m.T * C + 8.0 * U * C;
  ms = time_op(b, [&](int l) {
    const int i = l % sets;
    ops::encoder_backward(dwte[i], dwpe[i], dout[i], tokens[i], m.B, m.T, m.C, kBF16, b.stream);
  });
  char shape_u[96];
  std::snprintf(shape_u, sizeof(shape_u), "%s U=%.9g", shape.c_str(), U);  // a mean over the sets
  report(b, "encoder_backward bf16", shape_u, bwd_bytes, ms);
}

void bench_layernorm(Bench& b, const ModelShape& m) {
  const size_t N = (size_t)m.B * m.T, C = m.C;
  const std::string shape = rows_shape(m);
  if (has_row(b, "layernorm_forward bf16", shape)) return;
  Allocs a;
  const double fwd_bytes = 2.0 * N * C * 2 + 2.0 * C * 2 + 8.0 * N;
  const double bwd_bytes = 4.0 * N * C * 2 + 1.0 * C * 2 + 8.0 * N;
  const int sets = buffer_sets(b, (size_t)bwd_bytes);
  std::vector<void*> inp(sets), out(sets), weight(sets), bias(sets), dinp(sets), dout(sets);
  std::vector<float*> mean(sets), rstd(sets), dweight(sets), dbias(sets);
  for (int i = 0; i < sets; i++) {
    inp[i] = a.keep(random_device(b, N * C, kBF16, 60 + i));
    out[i] = a.keep(ops::alloc(N * C * 2));
    weight[i] = a.keep(random_device(b, C, kBF16, 61 + i));
    bias[i] = a.keep(random_device(b, C, kBF16, 62 + i));
    dinp[i] = a.keep(random_device(b, N * C, kBF16, 63 + i));
    dout[i] = a.keep(random_device(b, N * C, kBF16, 64 + i));
    mean[i] = a.keep((float*)ops::alloc(N * 4));
    rstd[i] = a.keep((float*)ops::alloc(N * 4));
    dweight[i] = a.keep((float*)random_device(b, C, DType::F32, 65 + i));
    dbias[i] = a.keep((float*)random_device(b, C, DType::F32, 66 + i));
  }
  double ms = time_op(b, [&](int l) {
    const int i = l % sets;
    ops::layernorm_forward(out[i], mean[i], rstd[i], inp[i], weight[i], bias[i], (int)N, m.C,
                           kBF16, b.stream);
  });
  report(b, "layernorm_forward bf16", shape, fwd_bytes, ms);
  ms = time_op(b, [&](int l) {  // mean/rstd of every set were written by the forward launches
    const int i = l % sets;
    ops::layernorm_backward(dinp[i], dweight[i], dbias[i], dout[i], inp[i], weight[i], mean[i],
                            rstd[i], (int)N, m.C, kBF16, b.stream);
  });
  report(b, "layernorm_backward bf16", shape, bwd_bytes, ms);
}

void bench_gelu(Bench& b, const ModelShape& m) {
  const size_t n = (size_t)m.B * m.T * 4 * m.C;
  char shape[64];
  std::snprintf(shape, sizeof(shape), "n=%zu (B=%d T=%d 4C=%d)", n, m.B, m.T, 4 * m.C);
  if (has_row(b, "gelu_forward bf16", shape)) return;
  Allocs a;
  const int sets = buffer_sets(b, 3 * n * 2);
  std::vector<void*> inp(sets), out(sets), dout(sets);
  for (int i = 0; i < sets; i++) {
    inp[i] = a.keep(random_device(b, n, kBF16, 70 + i));
    out[i] = a.keep(ops::alloc(n * 2));
    dout[i] = a.keep(random_device(b, n, kBF16, 71 + i));
  }
  double ms = time_op(b, [&](int l) {
    const int i = l % sets;
    ops::gelu_forward(out[i], inp[i], n, kBF16, b.stream);
  });
  report(b, "gelu_forward bf16", shape, 2.0 * n * 2, ms);
  ms = time_op(b, [&](int l) {
    const int i = l % sets;
    ops::gelu_backward(out[i], inp[i], dout[i], n, kBF16, b.stream);
  });
  report(b, "gelu_backward bf16", shape, 3.0 * n * 2, ms);
}

// Llama-3 8B's layer shapes (tiny stand-ins with --quick), B*T rows.
struct LlamaShape {
  int B, T, C, NH, NKV, HS, F;
};
LlamaShape llama_shape(const Bench& b) {
  if (b.quick) return {2, 64, 96, 4, 2, 24, 160};
  return {4, 2048, 4096, 32, 8, 128, 14336};
}

void bench_rmsnorm(Bench& b, const LlamaShape& m) {
  const size_t N = (size_t)m.B * m.T, C = m.C;
  char shape[64];
  std::snprintf(shape, sizeof(shape), "B=%d T=%d C=%d", m.B, m.T, m.C);
  Allocs a;
  const double fwd_bytes = 2.0 * N * C * 2 + 1.0 * C * 2 + 4.0 * N;
  const double bwd_bytes = 4.0 * N * C * 2 + 1.0 * C * 2 + 4.0 * N;
  const int sets = buffer_sets(b, (size_t)bwd_bytes);
  std::vector<void*> inp(sets), out(sets), weight(sets), dinp(sets), dout(sets);
  std::vector<float*> rstd(sets), dweight(sets);
  for (int i = 0; i < sets; i++) {
    inp[i] = a.keep(random_device(b, N * C, kBF16, 110 + i));
    out[i] = a.keep(ops::alloc(N * C * 2));
    weight[i] = a.keep(random_device(b, C, kBF16, 111 + i));
    dinp[i] = a.keep(random_device(b, N * C, kBF16, 112 + i));
    dout[i] = a.keep(random_device(b, N * C, kBF16, 113 + i));
    rstd[i] = a.keep((float*)ops::alloc(N * 4));
    dweight[i] = a.keep((float*)random_device(b, C, DType::F32, 114 + i));
  }
  double ms = time_op(b, [&](int l) {
    const int i = l % sets;
    ops::rmsnorm_forward(out[i], rstd[i], inp[i], weight[i], (int)N, m.C, 1e-5f, kBF16,
                         b.stream);
  });
  report(b, "rmsnorm_forward bf16", shape, fwd_bytes, ms);
  ms = time_op(b, [&](int l) {  // rstd of every set was written by the forward launches
    const int i = l % sets;
    ops::rmsnorm_backward(dinp[i], dweight[i], dout[i], inp[i], weight[i], rstd[i], (int)N, m.C,
                          kBF16, b.stream);
  });
  report(b, "rmsnorm_backward bf16", shape, bwd_bytes, ms);
}

void bench_rope(Bench& b, const LlamaShape& m) {
  const size_t N = (size_t)m.B * m.T, row = (size_t)(m.NH + 2 * m.NKV) * m.HS;
  char shape[96];
  std::snprintf(shape, sizeof(shape), "B=%d T=%d NH=%d NKV=%d HS=%d", m.B, m.T, m.NH, m.NKV,
                m.HS);
  Allocs a;
  const double bytes = 2.0 * N * (m.NH + m.NKV) * m.HS * 2 + 4.0 * m.T * m.HS;
  const int sets = buffer_sets(b, (size_t)bytes);
  std::vector<void*> qkv(sets);
  // Values, not real angles: the kernel's speed does not depend on them.
  float* cos_t = a.keep((float*)random_device(b, (size_t)m.T * m.HS / 2, DType::F32, 120));
  float* sin_t = a.keep((float*)random_device(b, (size_t)m.T * m.HS / 2, DType::F32, 121));
  for (int i = 0; i < sets; i++) qkv[i] = a.keep(random_device(b, N * row, kBF16, 122 + i));
  double ms = time_op(b, [&](int l) {  // in place: later launches rotate rotated values
    ops::rope_forward(qkv[l % sets], cos_t, sin_t, nullptr, m.B, m.T, m.NH, m.NKV, m.HS, kBF16,
                      b.stream);
  });
  report(b, "rope_forward bf16", shape, bytes, ms);
  ms = time_op(b, [&](int l) {
    ops::rope_backward(qkv[l % sets], cos_t, sin_t, nullptr, m.B, m.T, m.NH, m.NKV, m.HS, kBF16,
                       b.stream);
  });
  report(b, "rope_backward bf16", shape, bytes, ms);
}

void bench_swiglu(Bench& b, const LlamaShape& m) {
  const size_t N = (size_t)m.B * m.T, F = m.F;
  char shape[64];
  std::snprintf(shape, sizeof(shape), "B=%d T=%d F=%d", m.B, m.T, m.F);
  Allocs a;
  const int sets = buffer_sets(b, 5 * N * F * 2);
  std::vector<void*> inp(sets), out(sets), dout(sets), dinp(sets);
  for (int i = 0; i < sets; i++) {
    inp[i] = a.keep(random_device(b, N * 2 * F, kBF16, 130 + i, 2.0f));
    out[i] = a.keep(ops::alloc(N * F * 2));
    dout[i] = a.keep(random_device(b, N * F, kBF16, 131 + i));
    dinp[i] = a.keep(ops::alloc(N * 2 * F * 2));
  }
  double ms = time_op(b, [&](int l) {
    const int i = l % sets;
    ops::swiglu_forward(out[i], inp[i], (int)N, m.F, kBF16, b.stream);
  });
  report(b, "swiglu_forward bf16", shape, 3.0 * N * F * 2, ms);
  ms = time_op(b, [&](int l) {
    const int i = l % sets;
    ops::swiglu_backward(dinp[i], dout[i], inp[i], (int)N, m.F, kBF16, b.stream);
  });
  report(b, "swiglu_backward bf16", shape, 5.0 * N * F * 2, ms);
}

void bench_classifier(Bench& b, const ModelShape& m) {
  const size_t N = (size_t)m.B * m.T;
  char shape[64];
  std::snprintf(shape, sizeof(shape), "N=%zu V=%d Vp=%d", N, m.V, m.Vp);
  if (has_row(b, "classifier fwd+grad bf16", shape)) return;
  Allocs a;
  const double bytes = (double)N * m.V * 2 + (double)N * m.Vp * 2 + 8.0 * N;
  const int sets = buffer_sets(b, (size_t)bytes);
  std::vector<void*> logits(sets);
  std::vector<int*> targets(sets);
  std::vector<float*> losses(sets);
  for (int i = 0; i < sets; i++) {
    logits[i] = a.keep(random_device(b, N * m.Vp, kBF16, 80 + i, 3.0f));
    targets[i] = a.keep(random_tokens(N, m.V, 200 + i));
    losses[i] = a.keep((float*)ops::alloc(N * 4));
  }
  // In place: later launches see the gradients of earlier ones as logits - the same work.
  const double ms = time_op(b, [&](int l) {
    const int i = l % sets;
    ops::classifier_forward_backward(logits[i], losses[i], targets[i], 1.0f / N, (int)N, m.V,
                                     m.Vp, kBF16, b.stream);
  });
  report(b, "classifier fwd+grad bf16", shape, bytes, ms);
}

void bench_optimizer(Bench& b, const ModelShape& m) {
  const size_t n = m.parameters();
  const std::string shape = count_shape(m.name, n);
  Allocs a;
  float* master = a.keep((float*)random_device(b, n, DType::F32, 90));
  float* grad = a.keep((float*)random_device(b, n, DType::F32, 91, 1e-3f));
  float* mom = a.keep((float*)random_device(b, n, DType::F32, 92, 1e-3f));
  float* var = a.keep((float*)random_device(b, n, DType::F32, 93, 1e-6f, true));
  void* param = a.keep(ops::alloc(n * 2));
  AdamWStep step{6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 1};
  double ms = time_op(b, [&](int l) {
    step.t = l + 1;
    ops::adamw_update(master, param, grad, mom, var, n, step, kBF16, b.stream);
  });
  report(b, "adamw_update (+bf16 copy)", shape, 28.0 * n + 2.0 * n, ms);

  float* sum = a.keep((float*)random_device(b, 1, DType::F32, 94));
  ms = time_op(b, [&](int) { ops::sum_squares_accumulate(sum, grad, n, b.stream); });
  report(b, "sum_squares_accumulate fp32", shape, 4.0 * n, ms);
  ms = time_op(b, [&](int) { ops::add_inplace(mom, grad, n, b.stream); });
  report(b, "add_inplace fp32", shape, 12.0 * n, ms);
  ms = time_op(b, [&](int) { ops::cast(param, kBF16, master, DType::F32, n, b.stream); });
  report(b, "cast fp32 -> bf16", shape, 6.0 * n, ms);
  ms = time_op(b, [&](int) { ops::cast(master, DType::F32, param, kBF16, n, b.stream); });
  report(b, "cast bf16 -> fp32", shape, 6.0 * n, ms);
}

}  // namespace

void bench_memory(Bench& b) {
  for (const ModelShape& m : bench_models(b)) {
    bench_encoder(b, m);
    bench_layernorm(b, m);
    bench_gelu(b, m);
    bench_classifier(b, m);
    bench_optimizer(b, m);
  }
  const LlamaShape llama = llama_shape(b);
  bench_rmsnorm(b, llama);
  bench_rope(b, llama);
  bench_swiglu(b, llama);
  b.notes.push_back(
      "memory: GB/s = the fewest bytes an op must move (bench/bench_memory.cu) / median time; "
      "%ceil = of the copy bandwidth measured above; target >= 85% (the issue)");
}
