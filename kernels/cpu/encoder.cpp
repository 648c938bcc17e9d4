// kernels/cpu/encoder.cpp - token + position embedding, forward and backward.
//
// Forward: out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:], summed in fp32 and rounded once; rows in
// parallel.
// Vocabulary-parallel (tensor parallelism): wte holds rows [first, first + rows) of the table, a
// token outside them reads zeros and receives no gradient, and wpe may be absent (only one
// rank of the group adds the positions before the partial embeddings are summed).
// Positions: t, or per token positions[b*T + t] (packed documents: restarting at each one).
// Backward: dwte[token] += dout and dwpe[t] += sum_b dout (dwpe[positions[n]] += dout[n]). Several rows may hit the same token,
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
                           int T, int C, int first, int rows, const int* positions) {
  const int N = B * T;
#pragma omp parallel for schedule(static) if ((size_t)N * C > CPU_PARALLEL_MIN)
  for (int n = 0; n < N; n++) {
    const int row = tokens[n] - first;
    const bool mine = row >= 0 && row < rows;
    const Elem* w = wte + (size_t)row * C;
    const Elem* p = wpe + (size_t)(positions ? positions[n] : n % T) * C;
    Elem* o = out + (size_t)n * C;
    for (int c = 0; c < C; c++)
      store(o, c, (mine ? load(w, c) : 0.0f) + (wpe ? load(p, c) : 0.0f));
  }
}

template <typename Elem>
void encoder_backward_typed(float* dwte, float* dwpe, const Elem* dout, const int* tokens, int B,
                            int T, int C, int first, int rows, const int* positions) {
  const int chunks = (int)ceil_div(C, kChannelChunk);
#pragma omp parallel for schedule(static) if ((size_t)B * T * C > CPU_PARALLEL_MIN)
  for (int chunk = 0; chunk < chunks; chunk++) {
    const int c0 = chunk * kChannelChunk;
    const int c1 = std::min(C, c0 + kChannelChunk);
    for (int b = 0; b < B; b++) {
      for (int t = 0; t < T; t++) {
        const size_t n = (size_t)b * T + t;
        const Elem* d = dout + n * C;
        const int row = tokens[n] - first;
        if (row >= 0 && row < rows) {
          float* gw = dwte + (size_t)row * C;
          for (int c = c0; c < c1; c++) gw[c] += load(d, c);
        }
        if (dwpe) {
          float* gp = dwpe + (size_t)(positions ? positions[n] : t) * C;
          for (int c = c0; c < c1; c++) gp[c] += load(d, c);
        }
      }
    }
  }
}

}  // namespace
}  // namespace cpu

// Every token in [0, vocab_size) (the loader checked them; this is the kernel's own guard).
static void check_tokens(const char* op, const int* tokens, int N, int vocab_size) {
  for (int n = 0; n < N; n++)
    if (tokens[n] < 0 || tokens[n] >= vocab_size)
      BUG("%s: token %d at position %d is outside the vocabulary [0, %d)", op, tokens[n], n,
          vocab_size);
}

void encoder_forward(void* out, const int* tokens, const void* wte, const void* wpe, int B, int T,
                     int C, DType dt, Stream s, int vocab_first, int vocab_rows, int vocab_size,
                     const int* positions) {
  OP_SPAN(encoder_forward);
  if (is_dry(s)) return;
  check_tokens("encoder_forward", tokens, B * T, vocab_size);
  cpu::dispatch_dtype(dt, [&](auto tag) {
    using S = decltype(tag);
    cpu::encoder_forward_typed((S*)out, tokens, (const S*)wte, (const S*)wpe, B, T, C,
                               vocab_first, vocab_rows, positions);
  });
}

void encoder_backward(float* dwte, float* dwpe, const void* dout, const int* tokens, int B, int T,
                      int C, DType dt, Stream s, int vocab_first, int vocab_rows,
                      int vocab_size, const int* positions) {
  OP_SPAN(encoder_backward);
  if (is_dry(s)) return;
  check_tokens("encoder_backward", tokens, B * T, vocab_size);
  cpu::dispatch_dtype(dt, [&](auto tag) {
    using S = decltype(tag);
    cpu::encoder_backward_typed(dwte, dwpe, (const S*)dout, tokens, B, T, C, vocab_first,
                                vocab_rows, positions);
  });
}

}  // namespace ops
