// kernels/fp8.h - the two FP8 formats, exactly: float -> FP8 rounded to nearest even and
// saturated, FP8 -> float. Plain C++ that the CPU backend uses for every FP8 value it stores, so
// that it rounds exactly like the GPU's cvt.rn.satfinite instructions.
//
//   E4M3  1 sign, 4 exponent (bias 7), 3 mantissa bits. Largest finite 448 (0x7E), no infinity,
//         NaN = 0x7F. Smallest normal 2^-6, smallest subnormal 2^-9.
//   E5M2  1 sign, 5 exponent (bias 15), 2 mantissa bits. Largest finite 57344 (0x7B), infinity
//         0x7C, NaN 0x7D..0x7F. Smallest normal 2^-14, smallest subnormal 2^-16.
//
// Conversion (the "satfinite" mode): |x| above the largest finite value - infinity included -
// becomes the largest finite value with x's sign; NaN becomes 0x7F with x's sign; everything
// else is rounded to the nearest representable value, ties to the even mantissa, subnormals
// included (below half the smallest subnormal is zero). Training scales tensors into range
// before converting (model/fp8.h), so saturation only clips outliers, and never makes inf.
#pragma once
#include <cmath>
#include <cstdint>

#include "kernels/common.h"

// Callable from CUDA kernels too (the block scale below is computed on the device).
#if defined(__CUDACC__)
#define FP8_HOST_DEVICE __host__ __device__
#else
#define FP8_HOST_DEVICE
#endif

struct Fp8Format {
  int mantissa_bits, bias;
  float max_finite;
  int emax;  // exponent of the largest normal value: 448 = 1.75 * 2^8, 57344 = 1.75 * 2^15
};
inline Fp8Format fp8_format(DType t) {
  switch (t) {
    case DType::E4M3: return {3, 7, 448.0f, 8};
    case DType::E5M2: return {2, 15, 57344.0f, 15};
    default: break;
  }
  FATAL("fp8_format: %s is not an FP8 type", dtype_name(t));
}

// The value of an FP8 code.
inline float fp8_to_f32(uint8_t code, DType t) {
  const Fp8Format f = fp8_format(t);
  const int m_bits = f.mantissa_bits, e_bits = 7 - m_bits;
  const int sign = code >> 7, exp = (code >> m_bits) & ((1 << e_bits) - 1);
  const int man = code & ((1 << m_bits) - 1);
  const float s = sign ? -1.0f : 1.0f;
  if (t == DType::E4M3 && exp == 15 && man == 7) return NAN;
  if (t == DType::E5M2 && exp == 31) return man ? NAN : s * INFINITY;
  if (exp == 0) return s * std::ldexp((float)man, 1 - f.bias - m_bits);  // subnormal
  return s * std::ldexp((float)((1 << m_bits) | man), exp - f.bias - m_bits);
}

// x rounded to nearest even and saturated to the format (see the top of this file).
inline uint8_t f32_to_fp8(float x, DType t) {
  const Fp8Format f = fp8_format(t);
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  if (std::isnan(x)) return sign | 0x7F;
  const float a = std::fabs(x);
  const uint8_t max_code = t == DType::E4M3 ? 0x7E : 0x7B;
  if (a >= f.max_finite) return sign | max_code;
  // The spacing of representable values around a: 2^(e - m_bits) for a in [2^e, 2^(e+1)),
  // never finer than the subnormal spacing 2^(1 - bias - m_bits).
  int e = 0;
  std::frexp(a, &e);  // a = fr * 2^e, fr in [0.5, 1): a in [2^(e-1), 2^e)
  const int min_exp = 1 - f.bias;
  const int spacing_exp = (e - 1 < min_exp ? min_exp : e - 1) - f.mantissa_bits;
  const float steps = std::ldexp(a, -spacing_exp);  // exact: a power-of-two scaling
  float q = std::nearbyint(steps);                  // ties to even (default rounding mode)
  const float rounded = std::ldexp(q, spacing_exp);
  if (rounded > f.max_finite) return sign | max_code;  // rounding up past the largest finite
  // Encode: subnormal if below 2^min_exp, else normal.
  if (rounded < std::ldexp(1.0f, min_exp))
    return sign | (uint8_t)q;  // exponent field 0, mantissa q
  int re = 0;
  const float fr = std::frexp(rounded, &re);  // rounded = fr * 2^re, 2^(re-1) <= rounded
  const int exp_field = re - 1 + f.bias;
  const int man = (int)std::ldexp(fr * 2.0f - 1.0f, f.mantissa_bits);
  return sign | (uint8_t)((exp_field << f.mantissa_bits) | man);
}

// ---------------------------------------------------------------------------------------------
// Block scales (the "rowwise", "blockwise" and "mxfp8" recipes, model/fp8.h)
// ---------------------------------------------------------------------------------------------
// Each block of an operand gets its own scale, always a power of two 2^-k: multiplying by it (or
// by 2^k to dequantise) only moves the exponent, so the cast x * 2^-k is exact in fp32 before the
// FP8 rounding, and a decoded value code * 2^k is exact in fp32 and in bf16 (an FP8 code has at
// most 4 significant bits, bf16 8) unless it falls below 2^-126. The two rules for k, from the
// block's amax (largest |x|):
//
//   power of two ("rowwise", "blockwise"): the smallest k with amax / 2^k <= the format's largest
//       finite value, so nothing saturates; then k += margin. The scale fp8_max / amax of the
//       tensorwise recipe rounded down to a power of two: at most one bit of range unused.
//   E8M0 ("mxfp8", OCP Microscaling Formats (MX) v1.0, section 6.3): the shared exponent is
//       floor(log2(amax)) - emax_elem, emax_elem the exponent of the element format's largest
//       normal value (8 for E4M3, 15 for E5M2). Then amax / 2^k lies in [2^emax, 2^(emax+1)):
//       for E4M3 in [256, 512), so elements above 448 saturate to 448 - the specification's
//       choice, kept exactly (others round the exponent up instead, trading a bit of range for
//       no clipping). E8M0 holds 2^-127 .. 2^127 (0xFF is NaN): k is clamped into that range,
//       an all-zero block gets 2^-127, a block with inf or NaN a NaN scale. No margin.
//
// Returns 2^k, the dequantisation factor ("scale_inv"). k is clamped to [-126, 127] for the
// power-of-two rule (so that 2^-k is a finite fp32); an all-zero or non-finite block gets 1, as
// the tensorwise recipe does.
// ops::fp8_cast_blocks' arguments, checked the same way by both backends.
inline void check_fp8_cast_blocks(DType fp8, int rows, int cols, int block_rows, int block_cols) {
  CHECK(rows >= 0 && cols >= 0 && block_rows > 0 && block_cols > 0,
        "fp8_cast_blocks: shape %d x %d, blocks %d x %d", rows, cols, block_rows, block_cols);
  CHECK(fp8 == DType::E4M3 || fp8 == DType::E5M2, "fp8_cast_blocks: %s is not FP8",
        dtype_name(fp8));
}

FP8_HOST_DEVICE inline float fp8_pow2(int k) {  // 2^k for k in [-127, 127], built bit by bit
  const uint32_t bits = k >= -126 ? (uint32_t)(k + 127) << 23 : 0x00400000u;  // 2^-127: subnormal
  float f;
  __builtin_memcpy(&f, &bits, 4);
  return f;
}

FP8_HOST_DEVICE inline float fp8_block_scale_inv(float amax, float fp8_max, int emax, bool e8m0,
                                                 int margin) {
  if (!(amax <= 3.4028235e38f)) {  // inf or NaN
    const uint32_t nan_bits = 0x7FC00000u;
    float nan;
    __builtin_memcpy(&nan, &nan_bits, 4);
    return e8m0 ? nan : 1.0f;
  }
  if (amax == 0.0f) return e8m0 ? fp8_pow2(-127) : 1.0f;
  uint32_t bits;
  __builtin_memcpy(&bits, &amax, 4);
  const int field = (int)((bits >> 23) & 0xFF);
  int k;
  if (field == 0) {  // a subnormal amax: below 2^-126, so k sits at the bottom of its range
    k = e8m0 ? -127 : -126;
  } else {
    const int e = field - 127;  // floor(log2(amax))
    if (e8m0) {
      k = e - emax;
    } else {
      // amax = s 2^e with s in [1, 2); fp8_max = m 2^emax. amax <= fp8_max 2^k holds for
      // k = e - emax when s <= m, else it needs one more. s <= m compared exactly on the
      // significands: amax with its exponent replaced by fp8_max's.
      uint32_t scaled = (bits & 0x807FFFFFu) | ((uint32_t)(emax + 127) << 23);
      float s_at_emax;
      __builtin_memcpy(&s_at_emax, &scaled, 4);
      k = e - emax + (s_at_emax > fp8_max ? 1 : 0) + margin;
    }
  }
  const int lo = e8m0 ? -127 : -126;
  return fp8_pow2(k < lo ? lo : (k > 127 ? 127 : k));
}
