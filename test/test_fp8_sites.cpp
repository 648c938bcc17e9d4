// test/test_fp8_sites.cpp - every FP8 linear call of a real training step, checked against
// float64 (model/fp8.h is the recipe under test).
//
//   [mpirun -np TP] test_fp8_sites tensorwise|delayed|rowwise|blockwise|mxfp8 MOE(0|1) SEED
//
// A small GPT-2 (awkward sizes: d_model 96, 6 heads, 2 x 24 tokens, vocabulary 101; with MOE=1
// its second block is a mixture of experts, whose attention GEMMs stay FP8) runs two micro-steps
// of forward + backward on the CPU backend, with tensor + sequence parallelism over the ranks of
// the job. An observer (Fp8Context::observer) sees every call of fp8_linear_forward and
// fp8_linear_backward before and after it, and recomputes it here, independently of the code:
//
//   scales  the amax of the bf16 operand (max over the ranks: the recipe agrees it over the
//           group), the recipe's history for "delayed" (kept here, per site and operand), then
//           scale = fp8_max / amax / 2^margin in fp32. The code's stored scale and 1/scale must
//           equal these bit for bit. The backward casts the weight with the forward's scale.
//   blocks  (rowwise, blockwise, mxfp8) per block of each operand, in the layout the GEMM reads
//           it (rows x K; the backward's transposed operands blocked along their own K), the
//           power-of-two scale from the block's local amax: the smallest 2^-k that keeps the
//           amax within the format (times 2^-margin), or for mxfp8 k = floor(log2 amax) - emax
//           of the element format (8 E4M3, 15 E5M2), found here with frexp in double; every
//           block's stored 1/scale must equal 2^k bit for bit. Blocks: rowwise 1 x K; blockwise
//           1 x 128 for activations and gradients, 128 x 128 for weights; mxfp8 1 x 32. No amax
//           is agreed over ranks for these recipes (model/fp8.h).
//   codes   each operand element x * scale (fp32) rounded to the nearest E4M3 / E5M2 value by a
//           frexp-based rounding written here (ties to even, saturating at 448 / 57344).
//   GEMMs   the decoded operands multiplied in float64 and scaled by both 1/scales: the output
//           (+ bias + residual, then GELU where the layer has one), the input gradient (times
//           GELU' of the previous layer's pre-activation where given), the weight gradient
//           (accumulated onto what the buffer held) and the bias gradient (the bf16 dout's sum).
//
// Each result must lie within its analytic rounding bound: bf16 roundings of 2^-8 relative each
// (two for the output: the GEMM's, then the bias + residual sum's; two for an input gradient with
// GELU'), plus fp32 accumulation, (K + 4) * 2^-24 of the sum of the terms' magnitudes. The worst
// ratio error / bound per site kind (qkv, attention projection, fc, fc projection) is printed;
// every ratio must be <= 1. A weight gradient dequantised with a wrong scale (model/fp8.cu) is
// off by the ratio of two scales: tens of bounds. Every site kind must have been seen, forward
// and backward (an MoE block's fc sites are not FP8 and are not called).
// Prints "ok"/"FAIL" lines (rank 0); exit status 1 on failure on any rank.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "model/fp8.h"
#include "model/gpt.h"
#include "model/init.h"
#include "parallel/param_store.h"
#include "test/check_results.h"
#include "test/gpt_one_stage.h"

namespace {

const char* kKindNames[kBlockLinears] = {"qkv", "attn proj", "fc", "fc proj"};
const double kBf16 = 1.0 / 256, kF32 = 1.0 / (1 << 24);  // unit roundoffs: 8 and 24 bits

// x rounded to the nearest value of a float format with `mbits` mantissa bits, smallest normal
// exponent `min_exp` and largest finite value `vmax`: ties to even, saturating (model/fp8.h).
double fp8_round(float x, int mbits, int min_exp, double vmax) {
  double v = std::max(-vmax, std::min(vmax, (double)x));
  if (v == 0) return 0;
  int e;
  std::frexp(v, &e);  // |v| = m 2^e, m in [0.5, 1): the exponent of v is e - 1
  const double quantum = std::ldexp(1.0, std::max(e - 1, min_exp) - mbits);
  return std::nearbyint(v / quantum) * quantum;  // the default mode: ties to even
}

struct Format {
  int mbits, min_exp;
  double vmax;
  int emax;  // exponent of the largest normal value
};
const Format kE4M3{3, -6, 448.0, 8}, kE5M2{2, -14, 57344.0, 15};

// ---- the block recipes' reference ------------------------------------------------------------
struct BlockShape {
  int rows, cols;
};
enum class Granularity { Tensor, Row, Block, Mx };
Granularity granularity_of(const std::string& recipe) {
  if (recipe == "rowwise") return Granularity::Row;
  if (recipe == "blockwise") return Granularity::Block;
  if (recipe == "mxfp8") return Granularity::Mx;
  return Granularity::Tensor;
}
// The block of an operand (rows x K) of a recipe (the table at the top of this file).
BlockShape block_of(Granularity g, bool weight, int K) {
  if (g == Granularity::Row) return {1, K};
  if (g == Granularity::Block) return weight ? BlockShape{128, 128} : BlockShape{1, 128};
  return {1, 32};
}

// 2^k, the dequantisation factor of a block whose amax is `amax`.
double block_scale_inv(double amax, const Format& fmt, bool mx, int margin) {
  if (amax == 0) return mx ? std::ldexp(1.0, -127) : 1.0;
  int e;
  std::frexp(amax, &e);  // amax in [2^(e-1), 2^e)
  int k;
  if (mx) {
    k = std::max(-127, std::min(127, e - 1 - fmt.emax));
  } else {
    k = e - 1 - fmt.emax - 1;
    while (amax > fmt.vmax * std::ldexp(1.0, k)) k++;
    k = std::max(-126, std::min(127, k + margin));
  }
  return std::ldexp(1.0, k);
}

// An operand of a block recipe: the logical matrix X (R x K) - x itself, or with transpose x^T
// for x (K x R) - decoded per block, and each block's 1/scale.
struct Quantized {
  std::vector<double> values;
  std::vector<float> scale_inv;
};
Quantized quantize_blocks(const std::vector<float>& x, int R, int K, bool transpose,
                          BlockShape b, const Format& fmt, bool mx, int margin) {
  auto at = [&](int i, int j) { return transpose ? x[(size_t)j * R + i] : x[(size_t)i * K + j]; };
  const int gr = (R + b.rows - 1) / b.rows, gc = (K + b.cols - 1) / b.cols;
  Quantized q;
  q.values.resize((size_t)R * K);
  q.scale_inv.resize((size_t)gr * gc);
  for (int bi = 0; bi < gr; bi++)
    for (int bj = 0; bj < gc; bj++) {
      const int i1 = std::min(R, (bi + 1) * b.rows), j1 = std::min(K, (bj + 1) * b.cols);
      double amax = 0;
      for (int i = bi * b.rows; i < i1; i++)
        for (int j = bj * b.cols; j < j1; j++) amax = std::max(amax, (double)std::fabs(at(i, j)));
      const double inv = block_scale_inv(amax, fmt, mx, margin);
      q.scale_inv[(size_t)bi * gc + bj] = (float)inv;
      for (int i = bi * b.rows; i < i1; i++)
        for (int j = bj * b.cols; j < j1; j++)
          q.values[(size_t)i * K + j] =
              fp8_round((float)(at(i, j) / inv), fmt.mbits, fmt.min_exp, fmt.vmax) * inv;
    }
  return q;
}

std::vector<float> download_bf16(const void* d, size_t n) {
  std::vector<uint16_t> h(n);
  ops::copy_to_host(h.data(), d, n * 2);
  std::vector<float> f(n);
  for (size_t i = 0; i < n; i++) f[i] = bf16_to_f32(h[i]);
  return f;
}
std::vector<float> download_f32(const float* d, size_t n) {
  std::vector<float> h(n);
  ops::copy_to_host(h.data(), d, n * 4);
  return h;
}

double gelu(double x) {
  return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}
double gelu_grad(double x) {
  const double k = std::sqrt(2 / M_PI), t = std::tanh(k * (x + 0.044715 * x * x * x));
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * 0.044715 * x * x);
}

// The worst error / bound of one quantity of one site kind.
struct Worst {
  double ratio = 0, err = 0, ref = 0;  // max error / bound; max error; max |reference|
  size_t elements = 0;
};

struct Observer {
  Comm* amax_group = nullptr;
  int rank = 0;
  std::map<std::pair<int, int>, std::deque<float>> history;  // (site, operand) -> amaxes
  std::map<int, float> weight_scale;                         // site -> the last forward's
  std::map<std::string, Worst> worst;                        // "qkv out" -> ...
  Granularity granularity = Granularity::Tensor;
  int scale_mismatches = 0, calls = 0;
  bool seen[kBlockLinears][2] = {};
  // Before a call: what it reads (copies, since it may overwrite them)
  std::vector<float> inp, weight, bias, residual, dout, gelu_input, dweight, dbias;
};

// The recipe's scale for `operand` of `site` whose local amax is `amax` (model/fp8.h).
float reference_scale(Observer& o, const Fp8Context& f, int site, int operand, float amax,
                      const Format& fmt) {
  amax = (float)all_reduce_host_max(*o.amax_group, amax);
  float used = amax;
  if (f.recipe.delayed) {
    std::deque<float>& h = o.history[{site, operand}];
    float past = 0;
    for (float a : h) past = std::max(past, a);
    if (past > 0) used = past;
    h.push_front(amax);
    if ((int)h.size() > f.recipe.history) h.pop_back();
  }
  return (float)((float)fmt.vmax / used) / (float)std::ldexp(1.0, f.recipe.margin);
}

float local_amax(const std::vector<float>& x) {
  float m = 0;
  for (float v : x) m = std::max(m, std::fabs(v));
  return m;
}

// The code's scale and 1/scale must be the reference's, bit for bit.
void check_scale(Observer& o, const Fp8Scaling& sc, float want, const char* what, int site) {
  float got[3];
  ops::copy_to_host(got, sc.state, sizeof(got));
  const float want_inv = 1.0f / want;
  if (std::memcmp(&got[1], &want, 4) != 0 || std::memcmp(&got[2], &want_inv, 4) != 0) {
    if (o.scale_mismatches++ < 5)
      std::printf("[rank %d] site %d %s: scale %.9g (1/scale %.9g), the recipe's %.9g\n", o.rank,
                  site, what, got[1], got[2], want);
  }
}

// Decoded operand: each x * scale rounded to the format, as float64.
std::vector<double> decode(const std::vector<float>& x, float scale, const Format& fmt) {
  std::vector<double> d(x.size());
  for (size_t i = 0; i < x.size(); i++)
    d[i] = fp8_round(x[i] * scale, fmt.mbits, fmt.min_exp, fmt.vmax);
  return d;
}

// C (M,N) = A . B^T / (sa sb) in float64 with A (M,K), B (N,K) given by their strides; also the
// sum of the terms' magnitudes, for the fp32 accumulation bound.
void gemm64(const std::vector<double>& A, size_t a_row, size_t a_col, const std::vector<double>& B,
            size_t b_row, size_t b_col, int M, int N, int K, double inv, std::vector<double>& C,
            std::vector<double>& mag) {
  C.assign((size_t)M * N, 0);
  mag.assign((size_t)M * N, 0);
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++) {
      double s = 0, m = 0;
      for (int k = 0; k < K; k++) {
        const double t = A[i * a_row + k * a_col] * B[j * b_row + k * b_col];
        s += t, m += std::fabs(t);
      }
      C[(size_t)i * N + j] = s * inv, mag[(size_t)i * N + j] = m * inv;
    }
}

void record(Observer& o, int site, const char* what, double err, double bound, double ref) {
  Worst& w = o.worst[std::string(kKindNames[site % kBlockLinears]) + " " + what];
  w.ratio = std::max(w.ratio, err / bound);
  w.err = std::max(w.err, err);
  w.ref = std::max(w.ref, std::fabs(ref));
  w.elements++;
}

// A block recipe's operand: the reference's quantisation, its scales checked bitwise against
// the code's (`stored`, after the call).
std::vector<double> block_operand(Observer& o, const Fp8Context& f, const float* stored,
                                  const std::vector<float>& x, int R, int K, bool transpose,
                                  bool weight, const Format& fmt, const char* what, int site) {
  const bool mx = o.granularity == Granularity::Mx;
  Quantized q = quantize_blocks(x, R, K, transpose, block_of(o.granularity, weight, K), fmt, mx,
                                f.recipe.margin);
  const std::vector<float> got = download_f32(stored, q.scale_inv.size());
  for (size_t i = 0; i < got.size(); i++)
    if (std::memcmp(&got[i], &q.scale_inv[i], 4) != 0) {
      if (o.scale_mismatches++ < 5)
        std::printf("[rank %d] site %d %s: block %zu 1/scale %.9g, the recipe's %.9g\n", o.rank,
                    site, what, i, got[i], q.scale_inv[i]);
      break;
    }
  return std::move(q.values);
}

void check_forward_output(Observer& o, const Fp8Call& c, const std::vector<double>& y,
                          const std::vector<double>& mag);

void check_forward_blocks(Observer& o, const Fp8Context& f, const Fp8Call& c) {
  const std::vector<double> x =
      block_operand(o, f, f.x8_scale, o.inp, c.N, c.C, false, false, kE4M3, "input", c.site);
  const std::vector<double> w =
      block_operand(o, f, f.w8_scale, o.weight, c.OC, c.C, false, true, kE4M3, "weight", c.site);
  std::vector<double> y, mag;
  gemm64(x, c.C, 1, w, c.C, 1, c.N, c.OC, c.C, 1.0, y, mag);
  check_forward_output(o, c, y, mag);
}

void check_forward(Observer& o, const Fp8Context& f, const Fp8Call& c) {
  if (o.granularity != Granularity::Tensor) return check_forward_blocks(o, f, c);
  const Fp8Linear& L = f.linears[c.site];
  const float sx = reference_scale(o, f, c.site, 0, local_amax(o.inp), kE4M3);
  const float sw = reference_scale(o, f, c.site, 1, local_amax(o.weight), kE4M3);
  o.weight_scale[c.site] = sw;
  check_scale(o, L.input, sx, "input", c.site);
  check_scale(o, L.weight, sw, "weight", c.site);
  std::vector<double> y, mag;
  gemm64(decode(o.inp, sx, kE4M3), c.C, 1, decode(o.weight, sw, kE4M3), c.C, 1, c.N, c.OC, c.C,
         (double)(1.0f / sx) * (double)(1.0f / sw), y, mag);
  check_forward_output(o, c, y, mag);
}

// y (N,OC): the float64 product; then + bias + residual and GELU against the call's outputs.
void check_forward_output(Observer& o, const Fp8Call& c, const std::vector<double>& y,
                          const std::vector<double>& mag) {
  const size_t n = (size_t)c.N * c.OC;
  const std::vector<float> pre = download_bf16(c.pre_gelu ? c.pre_gelu : c.out, n);
  const std::vector<float> out = c.pre_gelu ? download_bf16(c.out, n) : pre;
  for (size_t i = 0; i < n; i++) {
    const double b = o.bias.empty() ? 0 : o.bias[i % c.OC];
    const double r = o.residual.empty() ? 0 : o.residual[i];
    const double ref = y[i] + b + r;
    const double bound = 1.01 * (2 * kBf16 * (std::fabs(y[i]) + std::fabs(b) + std::fabs(r)) +
                                 (c.C + 4) * kF32 * mag[i]) + 1e-30;
    record(o, c.site, "output", std::fabs(pre[i] - ref), bound, ref);
    if (c.pre_gelu) {  // out = gelu(pre_gelu) in fp32, rounded once
      const double g = gelu(pre[i]);
      record(o, c.site, "gelu", std::fabs(out[i] - g),
             1.01 * (kBf16 * std::fabs(g) + 1e-6 * std::fabs(pre[i])) + 1e-30, g);
    }
  }
}

// The float64 products of a backward call: the input gradient (N,C) and the weight gradient's
// increment (OC,C), with the sums of their terms' magnitudes.
struct BackwardRef {
  std::vector<double> dinp, dinp_mag, dw, dw_mag;
};

BackwardRef backward_tensorwise(Observer& o, const Fp8Context& f, const Fp8Call& c) {
  // The step here is gpt_forward_backward's, whole backwards (the B/W split of zero-bubble
  // pipelines scales W's gradient with grad_w, which these references do not model).
  const Fp8Linear& L = f.linears[c.site];
  const float sg = reference_scale(o, f, c.site, 2, local_amax(o.dout), kE5M2);
  const float sx = reference_scale(o, f, c.site, 3, local_amax(o.inp), kE4M3);
  const float sw = o.weight_scale.at(c.site);
  check_scale(o, L.grad, sg, "grad", c.site);
  check_scale(o, L.input_bwd, sx, "input (backward)", c.site);
  check_scale(o, L.weight, sw, "weight (backward)", c.site);
  const std::vector<double> g8 = decode(o.dout, sg, kE5M2), x8 = decode(o.inp, sx, kE4M3);
  BackwardRef r;
  if (c.dinp)  // dinp (N,C) = g (N,OC) . w (OC,C)
    gemm64(g8, c.OC, 1, decode(o.weight, sw, kE4M3), 1, c.C, c.N, c.C, c.OC,
           (double)(1.0f / sg) * (double)(1.0f / sw), r.dinp, r.dinp_mag);
  // dW (OC,C) += g^T (OC,N) . x (N,C)
  gemm64(g8, 1, c.OC, x8, 1, c.C, c.OC, c.C, c.N, (double)(1.0f / sg) * (double)(1.0f / sx),
         r.dw, r.dw_mag);
  return r;
}

// Block recipes: each operand in the layout its GEMM reads, blocked along its own K.
BackwardRef backward_blocks(Observer& o, const Fp8Context& f, const Fp8Call& c) {
  BackwardRef r;
  if (c.dinp) {  // dinp (N,C) = g (N,OC) . (w^T (C,OC))^T
    const std::vector<double> g = block_operand(o, f, f.g8_scale, o.dout, c.N, c.OC, false, false,
                                                kE5M2, "grad", c.site);
    const std::vector<double> wt = block_operand(o, f, f.w8t_scale, o.weight, c.C, c.OC, true,
                                                 true, kE4M3, "weight^T", c.site);
    gemm64(g, c.OC, 1, wt, c.OC, 1, c.N, c.C, c.OC, 1.0, r.dinp, r.dinp_mag);
  }
  // dW (OC,C) += g^T (OC,N) . (x^T (C,N))^T
  const std::vector<double> gt = block_operand(o, f, f.g8t_scale, o.dout, c.OC, c.N, true, false,
                                               kE5M2, "grad^T", c.site);
  const std::vector<double> xt = block_operand(o, f, f.x8t_scale, o.inp, c.C, c.N, true, false,
                                               kE4M3, "input^T", c.site);
  gemm64(gt, c.N, 1, xt, c.N, 1, c.OC, c.C, c.N, 1.0, r.dw, r.dw_mag);
  return r;
}

void check_backward(Observer& o, const Fp8Context& f, const Fp8Call& c) {
  CHECK(c.part == GradPart::Both, "test_fp8_sites: a split backward (site %d)", c.site);
  const BackwardRef r = o.granularity == Granularity::Tensor ? backward_tensorwise(o, f, c)
                                                             : backward_blocks(o, f, c);
  if (c.dinp) {
    const std::vector<float> got = download_bf16(c.dinp, (size_t)c.N * c.C);
    for (size_t i = 0; i < got.size(); i++) {
      const double gp = c.gelu_input ? gelu_grad(o.gelu_input[i]) : 1.0;
      const double want = r.dinp[i] * gp;
      const double bound = 1.01 * (2 * kBf16 * std::fabs(want) + (c.OC + 4) * kF32 *
                                   r.dinp_mag[i] * std::fabs(gp) + 1e-6 * std::fabs(r.dinp[i])) +
                           1e-30;
      record(o, c.site, "input grad", std::fabs(got[i] - want), bound, want);
    }
  }
  const std::vector<float> dw = download_f32(c.dweight, (size_t)c.OC * c.C);
  for (size_t i = 0; i < dw.size(); i++) {
    const double want = o.dweight[i] + r.dw[i];
    const double bound = 1.01 * ((c.N + 4) * kF32 * r.dw_mag[i] +
                                 2 * kF32 * (std::fabs(o.dweight[i]) + std::fabs(r.dw[i]))) + 1e-30;
    record(o, c.site, "weight grad", std::fabs(dw[i] - want), bound, want);
  }
  if (c.dbias) {
    const std::vector<float> db = download_f32(c.dbias, c.OC);
    for (int j = 0; j < c.OC; j++) {
      double s = 0, m = 0;
      for (int i = 0; i < c.N; i++) {
        const double g = o.dout[(size_t)i * c.OC + j];
        s += g, m += std::fabs(g);
      }
      const double want = o.dbias[j] + s;
      record(o, c.site, "bias grad", std::fabs(db[j] - want),
             1.01 * ((c.N + 2) * kF32 * (m + std::fabs(o.dbias[j]))) + 1e-30, want);
    }
  }
}

// Before a call: copy what it reads. After: recompute it.
void observe(const Fp8Context& f, const Fp8Call& c, void* user) {
  Observer& o = *(Observer*)user;
  ops::stream_sync(c.stream);
  if (!c.after) {
    o.inp = download_bf16(c.inp, (size_t)c.N * c.C);
    o.weight = download_bf16(c.weight, (size_t)c.OC * c.C);
    o.bias = c.bias ? download_bf16(c.bias, c.OC) : std::vector<float>{};
    o.residual = c.residual ? download_bf16(c.residual, (size_t)c.N * c.OC) : std::vector<float>{};
    if (c.backward) {
      o.dout = download_bf16(c.dout, (size_t)c.N * c.OC);
      o.gelu_input = c.gelu_input ? download_bf16(c.gelu_input, (size_t)c.N * c.C)
                                  : std::vector<float>{};
      o.dweight = download_f32(c.dweight, (size_t)c.OC * c.C);
      o.dbias = c.dbias ? download_f32(c.dbias, c.OC) : std::vector<float>{};
    }
    return;
  }
  o.calls++;
  o.seen[c.site % kBlockLinears][c.backward] = true;
  if (c.backward) check_backward(o, f, c);
  else check_forward(o, f, c);
}

}  // namespace

int main(int argc, char** argv) {
  int world_rank = 0, world_size = 1, local_rank = 0;
  runtime_init(&argc, &argv, &world_rank, &world_size, &local_rank);
  CHECK(argc == 4, "usage: %s tensorwise|delayed|rowwise|blockwise|mxfp8 MOE(0|1) SEED",
        argv[0]);
  const std::string recipe_name = argv[1];
  const bool delayed = recipe_name == "delayed";
  const bool moe = std::atoi(argv[2]) != 0;
  const uint64_t seed = std::strtoull(argv[3], nullptr, 10);
  ops::device_init(local_rank);
  MeshShape shape;
  shape.tp = world_size, shape.sp = true;
  Mesh mesh;
  mesh_init(mesh, shape, world_rank, local_rank, CommBackend::MPI);
  ModelConfig mc;
  mc.n_layer = 2, mc.n_head = 6, mc.d_model = 96, mc.seq_len = 24, mc.vocab_size = 101;
  if (moe) mc.n_experts = 4, mc.top_k = 2, mc.moe_every = 2, mc.d_expert = 80;
  GPTLayout layout = gpt_layout(mc, mesh);
  const int B = 2, T = mc.seq_len;
  ops::Stream s = ops::stream_create(StreamOptions{});
  ParamStore store;
  param_store_init(store, layout.units, ShardingMode::Replicated, DType::BF16, mesh_comms(mesh), s,
                   s, random_init_fill(seed));
  Fp8Recipe recipe;
  recipe.granularity = fp8_granularity(recipe_name);
  recipe.delayed = delayed, recipe.history = 3;
  recipe.margin = delayed || recipe_name == "blockwise" ? 1 : 0;
  recipe.amax_group = &mesh[Axis::Stage];
  GPT model;
  gpt_create(model, layout, DType::BF16, Recompute::None, B, T, s, &recipe);
  Results r;
  r.verbose = world_rank == 0;
  Observer o;
  o.amax_group = recipe.amax_group, o.rank = world_rank;
  o.granularity = granularity_of(recipe_name);
  model.fp8->observer = observe;
  model.fp8->observer_user = &o;

  std::mt19937 rng((uint32_t)seed);  // the same tokens on every tp rank
  std::uniform_int_distribution<int> token(0, mc.vocab_size - 1);
  grads_zero(store);
  for (int micro = 0; micro < 2; micro++) {  // two micro-steps: delayed scaling has a history
    std::vector<int> tokens(2 * (size_t)B * T);
    for (int& t : tokens) t = token(rng);
    const float scale = 1.0f / (2 * B * T);
    gpt_forward_backward(model, store, tokens.data(), tokens.data() + (size_t)B * T, B, T, scale,
                         scale, s);
  }
  grads_wait(store);
  ops::stream_sync(s);

  const std::string what = std::string(argv[1]) + (moe ? ", MoE block" : "") + ", tp=" +
                           std::to_string(world_size);
  for (const auto& [name, w] : o.worst)
    r.check(w.ratio <= 1, "%s: %s within its rounding bound: worst error/bound %.3f, max error "
            "%.3g of max |ref| %.3g (%zu elements)", what.c_str(), name.c_str(), w.ratio, w.err,
            w.ref, w.elements);
  r.check(o.scale_mismatches == 0, "%s: every scale and 1/scale bitwise the recipe's (%d calls, "
          "%d mismatches)", what.c_str(), o.calls, o.scale_mismatches);
  bool all_seen = true;
  for (int k = 0; k < kBlockLinears; k++) all_seen &= o.seen[k][0] && o.seen[k][1];
  r.check(all_seen && o.calls == 2 * 2 * (moe ? 6 : 8), "%s: every site kind called forward "
          "and backward (%d calls)", what.c_str(), o.calls);
  const bool ok = all_agree(mesh[Axis::World], r.exit_status() == 0);  // also TEST_ONLY's count
  if (world_rank == 0)
    std::printf("test_fp8_sites: %d of %d checks failed on rank 0\n", r.failures, r.checks);
  model.fp8->observer = fp8_unobserved;
  gpt_destroy(model);
  param_store_destroy(store);
  ops::stream_destroy(s);
  mesh_destroy(mesh);
  runtime_finalize();
  return ok ? 0 : 1;
}
