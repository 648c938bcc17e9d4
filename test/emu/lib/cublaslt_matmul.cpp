// test/emu/lib/cublaslt_matmul.cpp - the arithmetic of the cuBLASLt stand-in's cublasLtMatmul,
// on host memory, for a problem cublaslt_problem.cpp has checked.
//
// For every matrix b of the batch and every element (i, j) of D:
//   acc = sum_k op(A)(i,k) * op(B)(k,j)                       products exact, summed in double
//   t   = float(alpha * sa * sb * acc + beta * C(i,j) + bias)  one rounding to the fp32 "accumulator"
//   epilogue: DEFAULT/BIAS   out = t
//             GELU_AUX(_BIAS) aux(i,j) = t (stored in the aux type), out = float(gelu(t))
//             DGELU          out = float(t * gelu'(aux(i,j)))
//             BGRADB         out = t; bias[j] = float(sum_k op(B)(k,j)), summed in double
//   amax_D = max |out| (before the D scale); D(i,j) = out (bf16: RNE; FP8: out * d_scale,
//            saturating RNE, as cuBLASLt converts to FP8 outputs).
// C is read only when beta != 0 (cuBLAS: "C may be invalid when beta is 0"); the bias term is
// present for BIAS and GELU_AUX_BIAS, with bias[i] (+ bias batch stride * b).
//
// Why double: every operand type here (fp32, TF32, bf16, FP8) is exact in float, and the product
// of two floats is exact in double, so the sum is the exact dot product up to double rounding
// (relative 2^-53 per term), whatever the summation order. The result is then the correctly
// rounded fp32 value of the documented formula: the best case of every real GPU, whose tensor
// cores sum in fp32 (or less) in an order of their own, so GPU results differ from these by up
// to about k * 2^-24 * sum |a b|; callers' tolerances must allow that (the stand-in cannot
// prove them). The sum runs over k in four interleaved partial sums in a fixed order: results
// are deterministic and independent of the thread count.
//
// CUBLAS_COMPUTE_32F_FAST_TF32: A and B are rounded to TF32 (10 mantissa bits, to nearest, ties
// away from zero, as cvt.rna.tf32.f32 does) before the products, so that the emulated run loses
// the precision a GPU would; 32F keeps full fp32 operands. FAST_ACCUM changes nothing (the flag
// allows a less accurate sum; it does not require one). GELU is the tanh form used by GPT-2 (and
// by the project's kernels): cuBLASLt does not document its GELU formula.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "test/emu/lib/cublaslt_state.h"

namespace cublaslt_standin {
namespace {

float load(const void* base, int64_t offset, cudaDataType_t t) {
  switch (t) {
    case CUDA_R_32F: return static_cast<const float*>(base)[offset];
    case CUDA_R_16BF: return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[offset]);
    case CUDA_R_8F_E4M3: return float(static_cast<const __nv_fp8_e4m3*>(base)[offset]);
    case CUDA_R_8F_E5M2: return float(static_cast<const __nv_fp8_e5m2*>(base)[offset]);
    default: return NAN;  // describe_problem admits no other type
  }
}

void store(void* base, int64_t offset, cudaDataType_t t, float v) {
  switch (t) {
    case CUDA_R_32F: static_cast<float*>(base)[offset] = v; return;
    case CUDA_R_16BF: static_cast<__nv_bfloat16*>(base)[offset] = __float2bfloat16_rn(v); return;
    case CUDA_R_8F_E4M3:
      static_cast<__nv_fp8_storage_t*>(base)[offset] =
          __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
      return;
    case CUDA_R_8F_E5M2:
      static_cast<__nv_fp8_storage_t*>(base)[offset] =
          __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E5M2);
      return;
    default: return;
  }
}

// Round to TF32: keep 10 of fp32's 23 mantissa bits, to nearest, ties away from zero.
float to_tf32(float x) {
  if (!std::isfinite(x)) return x;
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u = (u + 0x1000u) & ~0x1fffu;
  std::memcpy(&x, &u, 4);
  return x;
}

constexpr double kGeluScale = 0.7978845608028654;  // sqrt(2 / pi)
constexpr double kGeluCube = 0.044715;
// 0.5 x (1 + tanh u) with u = sqrt(2/pi) (x + 0.044715 x^3), written as x sigmoid(2u) and
// 1 - tanh^2 u as sigmoid(2u) sigmoid(-2u) * 4, which lose nothing to cancellation for x << 0.
double gelu(double x) {
  const double u = kGeluScale * (x + kGeluCube * x * x * x);
  return x / (1.0 + std::exp(-2.0 * u));
}
double gelu_grad(double x) {
  const double u = kGeluScale * (x + kGeluCube * x * x * x);
  const double up = 1.0 / (1.0 + std::exp(-2.0 * u)), down = 1.0 / (1.0 + std::exp(2.0 * u));
  return up + 2.0 * x * up * down * kGeluScale * (1.0 + 3.0 * kGeluCube * x * x);
}

// Row r of op(X) (or column r of op(X) for B), k-contiguous: out[r * k + kk]. `rows_are_i`: the
// wanted index r runs over the layout's rows (op N for A, op T for B), else over its columns.
void gather(std::vector<float>& out, const Layout& l, const void* base, int64_t batch,
            bool rows_are_i, int64_t count, int64_t k, bool tf32) {
  out.resize((size_t)(count * k));
  for (int64_t r = 0; r < count; r++)
    for (int64_t kk = 0; kk < k; kk++) {
      const int64_t off = rows_are_i ? element_offset(l, r, kk, batch)
                                     : element_offset(l, kk, r, batch);
      const float v = load(base, off, l.type);
      out[(size_t)(r * k + kk)] = tf32 ? to_tf32(v) : v;
    }
}

double dot(const float* a, const float* b, int64_t k) {
  double s[4] = {0, 0, 0, 0};
  int64_t kk = 0;
  for (; kk + 4 <= k; kk += 4)
    for (int l = 0; l < 4; l++) s[l] += (double)a[kk + l] * (double)b[kk + l];
  for (; kk < k; kk++) s[0] += (double)a[kk] * (double)b[kk];
  return (s[0] + s[1]) + (s[2] + s[3]);
}

// What one batch needs besides the operands: the scalars and the epilogue's pointers.
struct Batch {
  const Problem* p;
  int64_t index;
  double scale;  // alpha * sa * sb
  float beta;
  const void* C;
  void* D;
  float d_scale;
};

// Element (i, j) of one batch, from its accumulated dot product; returns |out| for amax_D.
float finish_element(const Batch& bt, int64_t i, int64_t j, double acc) {
  const Problem& p = *bt.p;
  const MatmulDesc& d = *p.desc;
  double t = bt.scale * acc;
  if (bt.beta != 0.0f) t += (double)bt.beta * load(bt.C, element_offset(*p.c, i, j, bt.index), p.c->type);
  if (d.epilogue == CUBLASLT_EPILOGUE_BIAS || d.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS)
    t += load(d.bias, bt.index * d.bias_batch_stride + i, p.bias_type);
  const float tf = (float)t;
  float out = tf;
  const int64_t aux_at = bt.index * d.aux_batch_stride + i + j * d.aux_ld;
  if (d.epilogue == CUBLASLT_EPILOGUE_GELU_AUX || d.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS) {
    store(const_cast<void*>(d.aux), aux_at, p.aux_type, tf);
    out = (float)gelu(tf);
  } else if (d.epilogue == CUBLASLT_EPILOGUE_DGELU) {
    out = (float)((double)tf * gelu_grad(load(d.aux, aux_at, p.aux_type)));
  }
  const float scaled = p.desc->d_scale ? out * bt.d_scale : out;
  store(bt.D, element_offset(*p.d, i, j, bt.index), p.d->type, scaled);
  return std::fabs(out);
}

// One matrix of the batch; returns its amax (NaN if any output is NaN).
float run_batch(const Batch& bt, const void* A, const void* B) {
  const Problem& p = *bt.p;
  const MatmulDesc& d = *p.desc;
  const bool tf32 = d.compute == CUBLAS_COMPUTE_32F_FAST_TF32;
  std::vector<float> a_rows, b_cols;
  gather(a_rows, *p.a, A, bt.index, d.trans_a == CUBLAS_OP_N, p.m, p.k, tf32);
  gather(b_cols, *p.b, B, bt.index, d.trans_b == CUBLAS_OP_T, p.n, p.k, false);
  std::vector<float> b_tf32 = b_cols;
  if (tf32)
    for (float& v : b_tf32) v = to_tf32(v);
  std::vector<float> column_amax((size_t)p.n, 0.0f);
#pragma omp parallel for schedule(static)
  for (int64_t j = 0; j < p.n; j++) {
    const float* bj = b_tf32.data() + j * p.k;
    float amax = 0.0f;
    for (int64_t i = 0; i < p.m; i++) {
      const float v = finish_element(bt, i, j, dot(a_rows.data() + i * p.k, bj, p.k));
      amax = std::isnan(v) || std::isnan(amax) ? NAN : std::fmax(amax, v);
    }
    column_amax[(size_t)j] = amax;
    if (d.epilogue == CUBLASLT_EPILOGUE_BGRADB) {
      double sum = 0;
      for (int64_t kk = 0; kk < p.k; kk++) sum += b_cols[(size_t)(j * p.k + kk)];
      store(const_cast<void*>(d.bias), bt.index * d.bias_batch_stride + j, p.bias_type, (float)sum);
    }
  }
  float amax = 0.0f;
  for (float v : column_amax) amax = std::isnan(v) || std::isnan(amax) ? NAN : std::fmax(amax, v);
  return amax;
}

}  // namespace

void run_matmul(const Problem& p, float alpha, const void* A, const void* B, float beta,
                const void* C, void* D) {
  const MatmulDesc& d = *p.desc;
  double scale = alpha;
  if (d.a_scale) scale *= *d.a_scale;
  if (d.b_scale) scale *= *d.b_scale;
  float amax = 0.0f;
  for (int64_t b = 0; b < p.batches; b++) {
    const Batch bt{&p, b, scale, beta, C, D, d.d_scale ? *d.d_scale : 1.0f};
    const float batch_amax = run_batch(bt, A, B);
    amax = std::isnan(batch_amax) || std::isnan(amax) ? NAN : std::fmax(amax, batch_amax);
  }
  if (d.amax_d) *d.amax_d = amax;
}

}  // namespace cublaslt_standin
