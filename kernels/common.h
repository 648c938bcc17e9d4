// kernels/common.h - what every file of the trainer shares: fatal errors that name file and line,
// the element types tensors are stored in, and bf16 rounding on the host.
//
// Errors: FATAL/CHECK print "error: <msg> (<file>:<line>)" and stop the whole job. Under MPI the
// communicator installs an abort hook (MPI_Abort) so that one failing rank ends every rank;
// without it the process exits with status 1. Messages meant for users name the config key, file
// or line themselves; file:line of the source is only the trailer.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>

[[noreturn]] void fatal_error(const char* file, int line, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));
// The communicator calls this once MPI is up: `abort_job` ends every rank, `rank_prefix` (e.g.
// "[rank 3] ") is printed before each fatal message.
void set_fatal_handler(void (*abort_job)(int exit_code), const char* rank_prefix);

#define FATAL(...) fatal_error(__FILE__, __LINE__, __VA_ARGS__)
#define CHECK(cond, ...)                                                   \
  do {                                                                     \
    if (!(cond)) fatal_error(__FILE__, __LINE__, __VA_ARGS__);             \
  } while (0)

// Element types of stored tensors. Master weights, Adam moments and weight gradients are always
// F32; activations and the working copy of the weights use the compute dtype ([precision]).
enum class DType : int { F32 = 0, BF16 = 1 };
inline size_t dtype_size(DType t) { return t == DType::F32 ? 4 : 2; }
inline const char* dtype_name(DType t) { return t == DType::F32 ? "fp32" : "bf16"; }

// bf16 = the top 16 bits of an IEEE float. Rounding to nearest, ties to even, is what the GPU's
// __float2bfloat16 does; the CPU backend stores every bf16 tensor through this function so that
// it sees the same rounding as the CUDA backend.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}
inline float bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// Round a float to the nearest bf16 value, kept as a float.
inline float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

inline size_t round_up(size_t x, size_t m) { return (x + m - 1) / m * m; }
inline size_t ceil_div(size_t x, size_t m) { return (x + m - 1) / m; }
