// bench/bench_attention.cu - causal attention forward and backward at B=8, NH=12, T=1024, HS=64
// (GPT-2 124M's shape) for each implementation the CUDA backend has, in TFLOP/s; and grouped-query
// attention at Llama-3 8B's shape (NH=32 query heads on NKV=8 kv heads, HS=128, B=1, T=8192)
// through the hand-written flash kernels (cuDNN's graph here is built for NKV = NH only).
//
// FLOPs (causal): forward 4*B*NH*T*T*HS / 2 (QK^T and PV over the lower triangle); backward 2.5x
// the forward. The backward call includes the Delta = rowsum(dO*O) pre-pass. With GQA the FLOPs
// are the same per query head (NH counts query heads); only the kv bytes shrink by NH/NKV.
// Implementations reachable through ops::attention_* (kernels/cuda/attention.cu), each on its own
// stream whose StreamOptions::attention forces the choice:
//   flash bf16     the hand-written tensor-core kernels (bf16, HS 64/128, 16-byte aligned rows)
//   cudnn bf16     cuDNN's fused flash attention (kernels/cuda/attention_cudnn.cu)
//   generic bf16   the exact fallback kernels in bf16; selected here by offsetting every pointer
//                  by one element so that the flash kernels decline (they need 16-byte rows)
//   generic fp32   the fallback in fp32 (what every fp32 run uses)
// The issue's target: the hand-written kernels at least as fast as cuDNN SDPA at T=1024, HS=64,
// or cuDNN by default where it wins ("auto" picks the faster per direction at run time). The
// flash rows' verdict compares them with the cudnn rows measured just before.
#include "bench/bench.h"

namespace {

struct Impl {
  const char* name;
  DType dt;
  size_t offset;  // elements added to every pointer (1 = misaligned rows: no flash)
  AttentionImpl choice;
};

struct Times {
  double fwd_ms = 0, bwd_ms = 0;
};

// "ok" when ms is at most the cuDNN time (cudnn_ms > 0), else how much slower.
std::string versus_cudnn(double ms, double cudnn_ms) {
  if (cudnn_ms <= 0) return "n/a: cuDNN did not run";
  if (ms <= cudnn_ms) return "ok";
  char line[64];
  std::snprintf(line, sizeof(line), "MISS: %.0f%% slower", 100.0 * (ms / cudnn_ms - 1));
  return line;
}

// One implementation at one shape: NKV kv heads for NH query heads (NKV = NH: multi-head).
Times bench_impl(Bench& b, const Impl& impl, int B, int T, int NH, int NKV, int HS,
                 const Times& cudnn) {
  const size_t C = (size_t)NH * HS, width = (size_t)(NH + 2 * NKV) * HS, rows = (size_t)B * T;
  const size_t es = dtype_size(impl.dt), pad = impl.offset * es;
  char* qkv = (char*)random_device(b, rows * width + impl.offset, impl.dt, 400);
  char* dout = (char*)random_device(b, rows * C + impl.offset, impl.dt, 401);
  char* out = (char*)ops::alloc(rows * C * es + pad);
  char* dqkv = (char*)ops::alloc(rows * width * es + pad);
  float* lse = (float*)ops::alloc((size_t)B * NH * T * 4);

  StreamOptions options;
  options.attention = impl.choice;
  ops::Stream saved = b.stream;
  b.stream = ops::stream_create(options);

  char shape[96];
  if (NKV == NH)
    std::snprintf(shape, sizeof(shape), "B=%d NH=%d T=%d HS=%d causal", B, NH, T, HS);
  else
    std::snprintf(shape, sizeof(shape), "B=%d NH=%d NKV=%d T=%d HS=%d causal", B, NH, NKV, T, HS);
  const double fwd_flops = 4.0 * B * NH * (double)T * T * HS / 2;
  const double fwd_ms = time_op(b, [&](int) {
    ops::attention_forward(out + pad, lse, qkv + pad, B, T, NH, NKV, HS, impl.dt, b.stream);
  });
  const double bwd_ms = time_op(b, [&](int) {
    ops::attention_backward(dqkv + pad, dout + pad, qkv + pad, out + pad, lse, B, T, NH, NKV, HS,
                            impl.dt, b.stream);
  });
  // What really ran: a forced "cudnn" that could not run cuDNN says so in its note.
  const std::string ran = ops::attention_impl_name(b.stream);
  ops::stream_destroy(b.stream);
  b.stream = saved;

  const bool is_flash = impl.choice == AttentionImpl::Flash && impl.dt == DType::BF16 &&
                        impl.offset == 0 && NKV == NH;  // GQA: no cuDNN row to compare with
  const std::string target = is_flash ? "<= cuDNN SDPA" : "";
  auto verdict = [&](double ms, double cudnn_ms) {
    return is_flash ? versus_cudnn(ms, cudnn_ms) : std::string("ran: ") + ran;
  };
  const std::string name = std::string("attention ") + impl.name;
  add_row(b, BenchRow{"attention", name + " fwd", shape, fwd_ms, fwd_flops / (fwd_ms * 1e9),
                      "TFLOP/s", -1, target, verdict(fwd_ms, cudnn.fwd_ms)});
  add_row(b, BenchRow{"attention", name + " bwd", shape, bwd_ms,
                      2.5 * fwd_flops / (bwd_ms * 1e9), "TFLOP/s", -1, target,
                      verdict(bwd_ms, cudnn.bwd_ms)});
  add_row(b, BenchRow{"attention", name + " fwd+bwd", shape, fwd_ms + bwd_ms,
                      3.5 * fwd_flops / ((fwd_ms + bwd_ms) * 1e9), "TFLOP/s", -1, target,
                      verdict(fwd_ms + bwd_ms, cudnn.fwd_ms + cudnn.bwd_ms)});
  for (void* p : {(void*)qkv, (void*)dout, (void*)out, (void*)dqkv, (void*)lse}) ops::release(p);
  // Times count as cuDNN's only where cuDNN really ran in both directions.
  const bool cudnn_ran = ran.find("forward cudnn") != std::string::npos &&
                         ran.find("backward cudnn") != std::string::npos &&
                         ran.find("unavailable") == std::string::npos;
  return cudnn_ran ? Times{fwd_ms, bwd_ms} : Times{};
}

}  // namespace

void bench_attention(Bench& b) {
  const int B = b.quick ? 1 : 8, T = b.quick ? 64 : 1024, NH = b.quick ? 2 : 12, HS = 64;
  const Impl cudnn_impl{"cudnn bf16", DType::BF16, 0, AttentionImpl::Cudnn};
  const Impl others[] = {{"flash bf16", DType::BF16, 0, AttentionImpl::Flash},
                         {"generic bf16", DType::BF16, 1, AttentionImpl::Flash},
                         {"generic fp32", DType::F32, 0, AttentionImpl::Flash}};
  const Times cudnn = bench_impl(b, cudnn_impl, B, T, NH, NH, HS, Times{});
  for (const Impl& impl : others) bench_impl(b, impl, B, T, NH, NH, HS, cudnn);
  // Llama-3 8B: 32 query heads on 8 kv heads, HS 128, one sequence of 8192 (quick: 4 on 1, 64).
  const Impl gqa{"flash bf16 gqa", DType::BF16, 0, AttentionImpl::Flash};
  bench_impl(b, gqa, 1, b.quick ? 64 : 8192, b.quick ? 4 : 32, b.quick ? 1 : 8, 128, Times{});
  b.notes.push_back(
      "attention: the flash rows' verdict compares the hand-written kernels with the cudnn rows; "
      "where cuDNN wins, [kernels] attention = \"auto\" (the default) runs cuDNN for that "
      "direction. For scale, published H100 bf16 forward, HS=64, non-causal (FA3 paper, "
      "https://arxiv.org/abs/2407.08608): FA2 282-324, cuDNN 335-413, FA3 333-497 TFLOP/s");
  b.notes.push_back(
      "attention: 'generic bf16' is the fallback kernel, reached by offsetting the pointers by "
      "one element (the flash kernels need 16-byte aligned rows)");
}
