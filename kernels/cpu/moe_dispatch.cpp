// kernels/cpu/moe_dispatch.cpp - moving the tokens of a mixture-of-experts layer, CPU backend
// (contracts in kernels/ops_decls.h), with the dispatch plan's indices:
//   moe_permute:            out[i] = in[rows[i]]                       (the dispatch, a gather)
//   moe_unpermute_backward: din[n] = sum_j dout[position[n*top_k + j]]  (its backward)
//   moe_combine:            out[n] = sum_j gate[p] * expert_out[position[p]]
//   moe_combine_backward:   d_expert_out[position[p]] = gate[p] * dout[n],
//                           d_gate[p] = dot(dout[n], expert_out[position[p]])
//
// Parallelism: output rows in parallel (OpenMP, static schedule). The trick that makes every
// op a gather: a token's rows in the dispatch buffer are listed by position, so each token row
// reads its top_k rows instead of top_k dispatch rows scattering into it, and each output
// element is one thread's fixed-order fp32 sum: bitwise the same on any number of threads. The
// combine's weighted sum is a chain of fmaf, as the contract says and the CUDA backend does it
// (__fmaf_rn), so the two agree to the bit whatever the compiler would contract.
#include "kernels/cpu/cpu_common.h"

namespace ops {
namespace cpu {
namespace {

template <typename T>
void permute_typed(T* out, const T* in, const int* rows, int M, int C) {
#pragma omp parallel for schedule(static) if ((size_t)M * C > CPU_PARALLEL_MIN)
  for (long i = 0; i < (long)M; i++)
    std::memcpy(out + (size_t)i * C, in + (size_t)rows[i] * C, (size_t)C * sizeof(T));
}

template <typename T>
void unpermute_backward_typed(T* din, const T* dout, const int* position, int N, int top_k,
                              int C) {
#pragma omp parallel for schedule(static) if ((size_t)N * top_k * C > CPU_PARALLEL_MIN)
  for (long n = 0; n < (long)N; n++) {
    const int* pos = position + (size_t)n * top_k;
    T* d = din + (size_t)n * C;
    for (int c = 0; c < C; c++) {
      float acc = 0.0f;
      for (int j = 0; j < top_k; j++)
        if (pos[j] >= 0) acc += load(dout, (size_t)pos[j] * C + c);  // < 0: a dropped pair
      store(d, c, acc);
    }
  }
}

template <typename T>
void combine_typed(T* out, const T* expert_out, const float* gate, const int* position, int N,
                   int top_k, int C) {
#pragma omp parallel for schedule(static) if ((size_t)N * top_k * C > CPU_PARALLEL_MIN)
  for (long n = 0; n < (long)N; n++) {
    const size_t p0 = (size_t)n * top_k;
    T* o = out + (size_t)n * C;
    for (int c = 0; c < C; c++) {
      float acc = 0.0f;
      for (int j = 0; j < top_k; j++)
        if (position[p0 + j] >= 0)  // a dropped pair contributes nothing
          acc = std::fmaf(gate[p0 + j], load(expert_out, (size_t)position[p0 + j] * C + c), acc);
      store(o, c, acc);
    }
  }
}

// One pair p of token row dout: its row of d_expert_out and its gate's gradient.
template <typename T>
void combine_backward_pair(T* dx, float* d_gate, const T* dout, const T* x, float gate, int C) {
  float dot = 0.0f;
  for (int c = 0; c < C; c++) {
    const float g = load(dout, c);
    store(dx, c, gate * g);
    dot = std::fmaf(g, load(x, c), dot);
  }
  *d_gate = dot;
}

template <typename T>
void combine_backward_typed(T* d_expert_out, float* d_gate, const T* dout, const T* expert_out,
                            const float* gate, const int* position, int N, int top_k, int C) {
#pragma omp parallel for schedule(static) if ((size_t)N * top_k * C > CPU_PARALLEL_MIN)
  for (long n = 0; n < (long)N; n++)
    for (int j = 0; j < top_k; j++) {
      const size_t p = (size_t)n * top_k + j, row = (size_t)position[p] * C;
      if (position[p] < 0) {  // a dropped pair: no row, no gradient for its gate
        d_gate[p] = 0.0f;
        continue;
      }
      combine_backward_pair(d_expert_out + row, d_gate + p, dout + (size_t)n * C,
                            expert_out + row, gate[p], C);
    }
}

}  // namespace
}  // namespace cpu

void moe_permute(void* out, const void* in, const int* rows, int M, int C, DType dt, Stream s) {
  OP_SPAN(moe_permute);
  if (is_dry(s)) return;
  cpu::dispatch_dtype(dt, [&](auto tag) {
    using S = decltype(tag);
    cpu::permute_typed((S*)out, (const S*)in, rows, M, C);
  });
}

void moe_unpermute_backward(void* din, const void* dout, const int* position, int N, int top_k,
                            int C, DType dt, Stream s) {
  OP_SPAN(moe_unpermute_backward);
  if (is_dry(s)) return;
  cpu::dispatch_dtype(dt, [&](auto tag) {
    using S = decltype(tag);
    cpu::unpermute_backward_typed((S*)din, (const S*)dout, position, N, top_k, C);
  });
}

void moe_combine(void* out, const void* expert_out, const float* gate, const int* position, int N,
                 int top_k, int C, DType dt, Stream s) {
  OP_SPAN(moe_combine);
  if (is_dry(s)) return;
  cpu::dispatch_dtype(dt, [&](auto tag) {
    using S = decltype(tag);
    cpu::combine_typed((S*)out, (const S*)expert_out, gate, position, N, top_k, C);
  });
}

void moe_combine_backward(void* d_expert_out, float* d_gate, const void* dout,
                          const void* expert_out, const float* gate, const int* position, int N,
                          int top_k, int C, DType dt, Stream s) {
  OP_SPAN(moe_combine_backward);
  if (is_dry(s)) return;
  cpu::dispatch_dtype(dt, [&](auto tag) {
    using S = decltype(tag);
    cpu::combine_backward_typed((S*)d_expert_out, d_gate, (const S*)dout, (const S*)expert_out,
                                gate, position, N, top_k, C);
  });
}

}  // namespace ops
