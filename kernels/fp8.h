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

struct Fp8Format {
  int mantissa_bits, bias;
  float max_finite;
};
inline Fp8Format fp8_format(DType t) {
  switch (t) {
    case DType::E4M3: return {3, 7, 448.0f};
    case DType::E5M2: return {2, 15, 57344.0f};
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
