// kernels/cpu/encoder.cpp - token + position embedding, forward and backward.
//
// Forward: out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:], summed in fp32 and rounded once; rows in
// parallel.
// Backward: dwte[token] += dout and dwpe[t] += sum_b dout. Several rows may hit the same token,
// so rows cannot be split between threads without racing. Instead the channels are split: a
// thread owns a fixed slice of columns of dwte and dwpe and walks all rows in order, so every
// element is updated in the same order whatever the thread count (bitwise reproducible).
#include "kernels/cpu/cpu_common.h"

namespace ops {
namespace cpu {
namespace {

constexpr int kChannelChunk = 64;  // columns per task in the backward

template <typename Elem>
void encoder_forward_typed(Elem* out, const int* tokens, const Elem* wte, const Elem* wpe, int B,
                           int T, int C) {
  const int N = B * T;
#pragma omp parallel for schedule(static) if ((size_t)N * C > CPU_PARALLEL_MIN)
  for (int n = 0; n < N; n++) {
    const int token = tokens[n];
    const int t = n % T;
    const Elem* w = wte + (size_t)token * C;
    const Elem* p = wpe + (size_t)t * C;
    Elem* o = out + (size_t)n * C;
    for (int c = 0; c < C; c++) store(o, c, load(w, c) + load(p, c));
  }
}

template <typename Elem>
void encoder_backward_typed(float* dwte, float* dwpe, const Elem* dout, const int* tokens, int B,
                            int T, int C) {
  const int chunks = (int)ceil_div(C, kChannelChunk);
#pragma omp parallel for schedule(static) if ((size_t)B * T * C > CPU_PARALLEL_MIN)
  for (int chunk = 0; chunk < chunks; chunk++) {
    const int c0 = chunk * kChannelChunk;
    const int c1 = std::min(C, c0 + kChannelChunk);
    for (int b = 0; b < B; b++) {
      for (int t = 0; t < T; t++) {
        const size_t n = (size_t)b * T + t;
        const Elem* d = dout + n * C;
        float* gw = dwte + (size_t)tokens[n] * C;
        float* gp = dwpe + (size_t)t * C;
        for (int c = c0; c < c1; c++) {
          const float g = load(d, c);
          gw[c] += g;
          gp[c] += g;
        }
      }
    }
  }
}

}  // namespace
}  // namespace cpu

void encoder_forward(void* out, const int* tokens, const void* wte, const void* wpe, int B, int T,
                     int C, DType dt, Stream s) {
  for (int n = 0; n < B * T; n++)
    CHECK(tokens[n] >= 0, "encoder_forward: token %d at %d", tokens[n], n);
  cpu::dispatch_dtype(dt, [&](auto tag) {
    using S = decltype(tag);
    cpu::encoder_forward_typed((S*)out, tokens, (const S*)wte, (const S*)wpe, B, T, C);
  });
}

void encoder_backward(float* dwte, float* dwpe, const void* dout, const int* tokens, int B, int T,
                      int C, DType dt, Stream s) {
  cpu::dispatch_dtype(dt, [&](auto tag) {
    using S = decltype(tag);
    cpu::encoder_backward_typed(dwte, dwpe, (const S*)dout, tokens, B, T, C);
  });
}

}  // namespace ops
