// kernels/cpu/reduce.cpp - fp32 reductions and elementwise helpers: sum of squares (gradient
// norm), scaled sum (loss), the step's scalars from every rank's part (the mean loss, the norm
// and the clipping factor: sum_parts, grad_norm_and_clip), in-place add, dtype cast, and the
// strided column copy with a cast that ring attention uses (copy_columns).
//
// Determinism trick for the sums: the input is cut into fixed chunks of kChunk elements (the cut
// depends only on n). Each chunk is summed in double by interleaved partial sums (vector_math.h;
// lane l takes the elements l, l + 16, ...), vectorised without changing any rounding; the
// lanes, then the chunks, are added in a fixed order. So the result is bitwise the same for any
// thread count and instruction set.
#include <vector>

#include "kernels/cpu/vector_math.h"

namespace ops {
namespace cpu {
namespace {

constexpr size_t kChunk = 1 << 14;

template <bool kSquare>
double deterministic_sum(const float* x, size_t n) {
  const size_t chunks = ceil_div(n, kChunk);
  std::vector<double> partial(chunks);
#pragma omp parallel for schedule(static) if (n > CPU_PARALLEL_MIN)
  for (size_t c = 0; c < chunks; c++) {
    const size_t begin = c * kChunk;
    const size_t len = std::min(kChunk, n - begin);
    partial[c] = kSquare ? sum_squares_span(x + begin, len) : sum_span(x + begin, len);
  }
  double total = 0.0;
  for (double p : partial) total += p;
  return total;
}

template <typename D, typename S>
void cast_typed(D* dst, const S* src, size_t n) {
#pragma omp parallel for schedule(static) if (n > CPU_PARALLEL_MIN)
  for (size_t i = 0; i < n; i++) store(dst, i, load(src, i));
}

// rows x width elements, row r at dst + r * dst_cols and src + r * src_cols; rows in parallel,
// each converted by the same load/store as cast_typed.
template <typename D, typename S>
void cast_columns(D* dst, size_t dst_cols, const S* src, size_t src_cols, size_t rows,
                  size_t width) {
#pragma omp parallel for schedule(static) if (rows * width > CPU_PARALLEL_MIN)
  for (size_t r = 0; r < rows; r++) {
    D* d = dst + r * dst_cols;
    const S* s = src + r * src_cols;
    for (size_t j = 0; j < width; j++) store(d, j, load(s, j));
  }
}

}  // namespace
}  // namespace cpu

void sum_squares_accumulate(float* out, const float* x, size_t n, Stream s) {
  OP_SPAN(sum_squares_accumulate);
  if (is_dry(s)) return;
  *out += (float)cpu::deterministic_sum<true>(x, n);
}

void sum_accumulate(float* out, const float* x, size_t n, float scale, Stream s) {
  OP_SPAN(sum_accumulate);
  if (is_dry(s)) return;
  *out += (float)(scale * cpu::deterministic_sum<false>(x, n));
}

// The parts in index order, in double (ops_decls.h).
static double sum_in_order(const float* parts, int n) {
  double total = 0.0;
  for (int i = 0; i < n; i++) total += (double)parts[i];
  return total;
}

void sum_parts(double* out, const float* parts, int n, double divisor, Stream s) {
  OP_SPAN(sum_parts);
  if (is_dry(s)) return;
  *out = sum_in_order(parts, n) / divisor;
}

void grad_norm_and_clip(double* norm, float* factor, const float* parts, int n, float grad_clip,
                        Stream s) {
  OP_SPAN(grad_norm_and_clip);
  if (is_dry(s)) return;
  *norm = std::sqrt(sum_in_order(parts, n));
  const double coef = grad_clip > 0 ? grad_clip / (*norm + 1e-6) : 1.0;
  *factor = coef < 1.0 ? (float)coef : 1.0f;
}

void add_inplace(float* dst, const float* src, size_t n, Stream s) {
  OP_SPAN(add_inplace);
  if (is_dry(s)) return;
#pragma omp parallel for schedule(static) if (n > CPU_PARALLEL_MIN)
  for (size_t i = 0; i < n; i++) dst[i] += src[i];
}

void cast(void* dst, DType dst_dt, const void* src, DType src_dt, size_t n, Stream s) {
  OP_SPAN(cast);
  if (is_dry(s)) return;
  if (dst_dt == src_dt) {
    if (n && dst != src) std::memmove(dst, src, n * dtype_size(dst_dt));
    return;
  }
  cpu::dispatch_dtype(dst_dt, [&](auto dst_tag) {
    cpu::dispatch_dtype(src_dt, [&](auto src_tag) {
      using D = decltype(dst_tag);
      using S = decltype(src_tag);
      cpu::cast_typed((D*)dst, (const S*)src, n);
    });
  });
}

void copy_columns(void* dst, int dst_cols, DType dst_dt, const void* src, int src_cols,
                  DType src_dt, int rows, int width, Stream s) {
  OP_SPAN(copy_columns);
  if (is_dry(s)) return;
  if (rows <= 0 || width <= 0) return;
  cpu::dispatch_dtype(dst_dt, [&](auto dst_tag) {
    cpu::dispatch_dtype(src_dt, [&](auto src_tag) {
      using D = decltype(dst_tag);
      using S = decltype(src_tag);
      cpu::cast_columns((D*)dst, dst_cols, (const S*)src, src_cols, rows, width);
    });
  });
}

}  // namespace ops
