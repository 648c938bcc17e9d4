// kernels/cpu/grad_compression.cpp - the kernels of the compressed gradient reductions
// (parallel/grad_compression.cu) on the CPU backend: int8 block quantisation with its error,
// the dequantised sum of several ranks' records, and top-k selection with its scatter-add.
//
// Every formula is the contract of kernels/ops_decls.h, written so that numpy (test/
// test_grad_compression.py) and the CUDA backend reproduce it bit for bit: the scale is one fp32
// division, the code one division rounded to nearest even (std::rint in the default rounding
// mode), every product and sum rounded once (x86-64 without -march has no FMA to contract into).
// Blocks of kQuantBlock values are independent, so they run in parallel; within a block the
// order is fixed. Top-k finds the k-th largest magnitude with nth_element over the magnitudes'
// bits, then walks the values in index order, which makes the tie rule (lower index first) and
// the increasing order of the record fall out of the loop.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_common.h"

namespace ops {
namespace cpu {
namespace {

// The codes and the scales of record c.
int8_t* record_codes(void* packed, size_t chunk_n, int c) {
  return (int8_t*)packed + (size_t)c * int8_record_bytes(chunk_n);
}
float* record_scales(void* packed, size_t chunk_n, int c) {
  return (float*)(record_codes(packed, chunk_n, c) + round_up(chunk_n, 4));
}

// One block of len values: its scale, its codes, its error.
void quantize_block(const float* x, size_t len, int8_t* q, float* scale_out, float* err,
                    bool accumulate) {
  float absmax = 0.0f;
  for (size_t i = 0; i < len; i++) absmax = std::max(absmax, std::fabs(x[i]));
  const float scale = absmax / 127.0f;
  *scale_out = scale;
  for (size_t i = 0; i < len; i++) {
    float code = scale > 0.0f ? std::rint(x[i] / scale) : 0.0f;
    code = std::min(127.0f, std::max(-127.0f, code));
    const float sent = code * scale;
    const float e = x[i] - sent;
    q[i] = (int8_t)code;
    err[i] = accumulate ? err[i] + e : e;
  }
}

// The magnitude of x as an ordered key: the float's bits without the sign.
inline uint32_t magnitude_key(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u & 0x7fffffffu;
}

}  // namespace
}  // namespace cpu

void int8_quantize(void* packed, float* err, const float* x, size_t chunk_n, int chunks,
                   bool accumulate_err, Stream s) {
  OP_SPAN(int8_quantize);
  if (is_dry(s)) return;
  const size_t blocks = ceil_div(chunk_n, kQuantBlock);
  const long total = (long)blocks * chunks;
#pragma omp parallel for schedule(static) if ((size_t)total * kQuantBlock > CPU_PARALLEL_MIN)
  for (long t = 0; t < total; t++) {
    const int c = (int)(t / blocks);
    const size_t b = (size_t)(t % blocks), first = b * kQuantBlock;
    const size_t len = std::min(kQuantBlock, chunk_n - first), at = c * chunk_n + first;
    cpu::quantize_block(x + at, len, cpu::record_codes(packed, chunk_n, c) + first,
                        cpu::record_scales(packed, chunk_n, c) + b, err + at, accumulate_err);
    if (b == 0)  // the record's padding after its codes: zero, so that every byte sent is set
      for (size_t i = chunk_n; i < round_up(chunk_n, 4); i++)
        cpu::record_codes(packed, chunk_n, c)[i] = 0;
  }
}

void int8_dequantize_sum(float* out, const void* packed, size_t chunk_n, int records, Stream s) {
  OP_SPAN(int8_dequantize_sum);
  if (is_dry(s)) return;
  void* p = const_cast<void*>(packed);
#pragma omp parallel for schedule(static) if (chunk_n * records > CPU_PARALLEL_MIN)
  for (size_t i = 0; i < chunk_n; i++) {
    float acc = 0.0f;
    for (int r = 0; r < records; r++) {
      const float d = (float)cpu::record_codes(p, chunk_n, r)[i] *
                      cpu::record_scales(p, chunk_n, r)[i / kQuantBlock];
      acc = acc + d;
    }
    out[i] = acc;
  }
}

void int8_dequantize(float* out, size_t n, const void* packed, size_t chunk_n, int records,
                     Stream s) {
  OP_SPAN(int8_dequantize);
  if (is_dry(s)) return;
  void* p = const_cast<void*>(packed);
  const size_t total = std::min(n, chunk_n * records);
#pragma omp parallel for schedule(static) if (total > CPU_PARALLEL_MIN)
  for (size_t j = 0; j < total; j++) {
    const int c = (int)(j / chunk_n);
    const size_t i = j % chunk_n;
    out[j] = (float)cpu::record_codes(p, chunk_n, c)[i] *
             cpu::record_scales(p, chunk_n, c)[i / kQuantBlock];
  }
}

void topk_select(int32_t* record, float* x, size_t n, size_t k, void* scratch, Stream s) {
  OP_SPAN(topk_select);
  if (is_dry(s)) return;
  CHECK(k <= n && n <= (size_t)INT32_MAX, "topk_select: k = %zu of n = %zu", k, n);
  if (k == 0) return;
  std::vector<uint32_t> keys(n);
  for (size_t i = 0; i < n; i++) keys[i] = cpu::magnitude_key(x[i]);
  std::nth_element(keys.begin(), keys.begin() + (k - 1), keys.end(), std::greater<uint32_t>());
  const uint32_t threshold = keys[k - 1];
  size_t above = 0;
  for (size_t i = 0; i < n; i++) above += cpu::magnitude_key(x[i]) > threshold;
  size_t equal_left = k - above, out = 0;  // ties at the threshold: the lowest indices
  float* values = (float*)(record + k);
  for (size_t i = 0; i < n && out < k; i++) {
    const uint32_t key = cpu::magnitude_key(x[i]);
    const bool take = key > threshold || (key == threshold && equal_left > 0);
    if (!take) continue;
    if (key == threshold) equal_left--;
    record[out] = (int32_t)i;
    values[out++] = x[i];
    x[i] = 0.0f;
  }
}

void topk_scatter_add(float* out, size_t first, size_t out_n, const int32_t* records, size_t k,
                      int records_n, Stream s) {
  OP_SPAN(topk_scatter_add);
  if (is_dry(s)) return;
  for (int r = 0; r < records_n; r++) {
    const int32_t* idx = records + (size_t)r * 2 * k;
    const float* val = (const float*)(idx + k);
    for (size_t j = 0; j < k; j++) {
      const size_t i = (size_t)idx[j];
      if (i >= first && i < first + out_n) out[i - first] = out[i - first] + val[j];
    }
  }
}

}  // namespace ops
