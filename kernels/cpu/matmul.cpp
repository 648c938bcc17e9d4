// kernels/cpu/matmul.cpp - the linear layer, forward and backward, on top of gemm.h.
//
//   forward:  y = inp (N,C) @ weight(OC,C)^T [+ bias] [+ residual];  out = y, or with pre_gelu:
//             pre_gelu = y, out = gelu(y). The epilogue works on the fp32 sums and rounds each
//             stored value once (cuBLASLt's BIAS / GELU_AUX epilogues behave the same).
//   backward: dinp = dout @ weight [* gelu'(gelu_input)]  (overwritten, fp32 sums, one rounding)
//             dweight += dout^T @ inp                     (fp32 sums added once to dweight)
//             dbias += sum_n dout                         (double per column, added once)
// Parallelism and determinism come from gemm(): tiles are independent and every sum runs over k
// in order. dbias splits the columns between threads, each summing its columns over all rows.
//
// grouped (a rank's experts): one loop over the groups, each the plain layer on its rows and its
// own weights, so a group's results are those of matmul_forward / matmul_backward, bit for bit.
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/vector_math.h"

namespace ops {
namespace cpu {
namespace {

constexpr int kColumnChunk = 64;

template <typename T>
void matmul_forward_typed(T* out, T* pre_gelu, const T* inp, const T* weight, const T* bias,
                          const T* residual, int N, int C, int OC, DType dt, Stream s) {
  const MatrixRef a{inp, dt, (size_t)C, 1};     // (N, C)
  const MatrixRef b{weight, dt, 1, (size_t)C};  // weight^T: (C, OC)
  gemm(s, a, b, N, OC, C, [&](int row, int col0, const float* sums, int ncols) {
    const size_t base = (size_t)row * OC + col0;
    float y[kTileCols];
    for (int j = 0; j < ncols; j++) y[j] = sums[j];
    if (bias)
      for (int j = 0; j < ncols; j++) y[j] += load(bias, col0 + j);
    if (residual)
      for (int j = 0; j < ncols; j++) y[j] += load(residual, base + j);
    if (pre_gelu) {
      store_row(pre_gelu + base, y, ncols);
      gelu_span(y, y, ncols);
    }
    store_row(out + base, y, ncols);
  });
}

template <typename T>
void matmul_backward_inputs(T* dinp, const T* dout, const T* weight, const T* gelu_input, int N,
                            int C, int OC, DType dt, Stream s) {
  const MatrixRef a{dout, dt, (size_t)OC, 1};   // (N, OC)
  const MatrixRef b{weight, dt, (size_t)C, 1};  // (OC, C)
  gemm(s, a, b, N, C, OC, [&](int row, int col0, const float* sums, int ncols) {
    const size_t base = (size_t)row * C + col0;
    if (!gelu_input) {
      store_row(dinp + base, sums, ncols);
      return;
    }
    float x[kTileCols], g[kTileCols];
    load_row(x, gelu_input + base, ncols);
    gelu_backward_span(g, x, sums, ncols);
    store_row(dinp + base, g, ncols);
  });
}

template <typename T>
void matmul_backward_weight(float* dweight, const T* dout, const T* inp, int N, int C, int OC,
                            DType dt, Stream s) {
  const MatrixRef a{dout, dt, 1, (size_t)OC};  // dout^T: (OC, N)
  const MatrixRef b{inp, dt, (size_t)C, 1};    // (N, C)
  gemm(s, a, b, OC, C, N, [&](int row, int col0, const float* sums, int ncols) {
    float* dw = dweight + (size_t)row * C + col0;
    for (int j = 0; j < ncols; j++) dw[j] += sums[j];
  });
}

template <typename T>
void matmul_backward_bias(float* dbias, const T* dout, int N, int OC) {
  const int chunks = (int)ceil_div(OC, kColumnChunk);
#pragma omp parallel for schedule(static) if ((size_t)N * OC > CPU_PARALLEL_MIN)
  for (int chunk = 0; chunk < chunks; chunk++) {
    const int o0 = chunk * kColumnChunk;
    const int width = std::min(OC, o0 + kColumnChunk) - o0;
    double sums[kColumnChunk] = {};
    for (int n = 0; n < N; n++) {
      const T* d = dout + (size_t)n * OC + o0;
      for (int j = 0; j < width; j++) sums[j] += load(d, j);
    }
    for (int j = 0; j < width; j++) dbias[o0 + j] += (float)sums[j];
  }
}

}  // namespace
}  // namespace cpu

void matmul_forward(void* out, void* pre_gelu, const void* inp, const void* weight,
                    const void* bias, const void* residual, int N, int C, int OC, DType dt,
                    Stream s) {
  OP_SPAN(matmul_forward);
  if (is_dry(s)) return;
  CHECK(!(pre_gelu && residual), "matmul_forward: the GELU epilogue takes no residual");
  cpu::dispatch_dtype(dt, [&](auto tag) {
    using S = decltype(tag);
    cpu::matmul_forward_typed((S*)out, (S*)pre_gelu, (const S*)inp, (const S*)weight,
                              (const S*)bias, (const S*)residual, N, C, OC, dt, s);
  });
}

void matmul_backward(void* dinp, float* dweight, float* dbias, const void* dout, const void* inp,
                     const void* weight, const void* gelu_input, int N, int C, int OC, DType dt,
                     Stream s) {
  OP_SPAN(matmul_backward);
  if (is_dry(s)) return;
  cpu::dispatch_dtype(dt, [&](auto tag) {
    using S = decltype(tag);
    if (dinp)
      cpu::matmul_backward_inputs((S*)dinp, (const S*)dout, (const S*)weight, (const S*)gelu_input,
                                  N, C, OC, dt, s);
    if (dweight)
      cpu::matmul_backward_weight(dweight, (const S*)dout, (const S*)inp, N, C, OC, dt, s);
    if (dbias) cpu::matmul_backward_bias(dbias, (const S*)dout, N, OC);
  });
}

void grouped_matmul_forward(void* out, void* pre_gelu, const void* inp, const void* weight,
                            const void* bias, const int* rows, int groups, int C, int OC,
                            DType dt, Stream s) {
  OP_SPAN(grouped_matmul_forward);
  if (is_dry(s)) return;
  const size_t e = dtype_size(dt);
  size_t row = 0;
  cpu::dispatch_dtype(dt, [&](auto tag) {
    using S = decltype(tag);
    for (int g = 0; g < groups; g++) {
      const int n = rows[g];
      auto at = [&](const void* base, size_t offset) {
        return base ? (S*)((char*)base + offset * e) : nullptr;
      };
      if (n > 0)
        cpu::matmul_forward_typed(at(out, row * OC), at(pre_gelu, row * OC), at(inp, row * C),
                                  at(weight, (size_t)g * OC * C), at(bias, (size_t)g * OC),
                                  (const S*)nullptr, n, C, OC, dt, s);
      row += n;
    }
  });
}

void grouped_matmul_backward(void* dinp, float* dweight, float* dbias, const void* dout,
                             const void* inp, const void* weight, const void* gelu_input,
                             const int* rows, int groups, int C, int OC, DType dt, Stream s) {
  OP_SPAN(grouped_matmul_backward);
  if (is_dry(s)) return;
  const size_t e = dtype_size(dt);
  size_t row = 0;
  cpu::dispatch_dtype(dt, [&](auto tag) {
    using S = decltype(tag);
    auto at = [&](const void* base, size_t offset) {
      return base ? (S*)((char*)base + offset * e) : nullptr;
    };
    for (int g = 0; g < groups; g++) {
      const int n = rows[g];
      const size_t w = (size_t)g * OC * C;
      const S* dout_g = at(dout, row * OC);
      if (n > 0 && dinp)
        cpu::matmul_backward_inputs(at(dinp, row * C), dout_g, at(weight, w),
                                    at(gelu_input, row * C), n, C, OC, dt, s);
      if (n > 0 && dweight)
        cpu::matmul_backward_weight(dweight + w, dout_g, at(inp, row * C), n, C, OC, dt, s);
      if (n > 0 && dbias) cpu::matmul_backward_bias(dbias + (size_t)g * OC, dout_g, n, OC);
      row += n;
    }
  });
}

}  // namespace ops

namespace ops {

void bias_backward(float* dbias, const void* dout, int N, int OC, DType dt, Stream s) {
  OP_SPAN(bias_backward);
  if (is_dry(s)) return;
  cpu::dispatch_dtype(dt, [&](auto tag) {
    using S = decltype(tag);
    cpu::matmul_backward_bias(dbias, (const S*)dout, N, OC);
  });
}

}  // namespace ops
