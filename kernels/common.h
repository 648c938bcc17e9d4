// kernels/common.h - what every file of the trainer shares: the ways to stop on an error, the
// element types tensors are stored in, and bf16 rounding on the host.
//
// Errors. Messages meant for users name the config key, file or value themselves and carry no
// source location of ours. Three ways to stop:
//   FATAL / CHECK          a failure this rank found, maybe alone (a full disk, a diverged loss,
//                          a device error): "error: <msg>" on stderr, "[rank r] " before it when
//                          there are several ranks, then the whole job is aborted (the hook
//                          parallel/comm_mpi_runtime.cu installs calls MPI_Abort, so one
//                          failing rank ends every rank). Without the hook the process exits
//                          with status 1.
//   FATAL_ALL / CHECK_ALL  an error every rank finds alike, at the same point of the code (the
//                          config, the layout, the data and model files): rank 0 alone prints
//                          "error: <msg>", every rank leaves MPI cleanly and exits with status 1,
//                          so the job ends without an abort. Only for errors that truly every
//                          rank reaches: a rank that reaches it alone waits for the others.
//   BUG                    a broken internal invariant: as FATAL, with the source file and line.
#pragma once
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>

// `file` = nullptr: no source location in the message (FATAL, CHECK); the CUDA, cuBLAS, cuDNN
// and NCCL status checks pass theirs, as BUG does.
[[noreturn]] void fatal_error(const char* file, int line, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));
[[noreturn]] void fatal_all_ranks(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
// The runtime calls these once MPI is up (parallel/mesh.cu). `abort_job` ends every rank,
// `rank_prefix` (e.g. "[rank 3] ") is printed before each FATAL message. `finish_job` leaves MPI
// cleanly (all ranks call it for FATAL_ALL); `prints` is true on the one rank that prints
// FATAL_ALL messages (rank 0).
void set_fatal_handler(void (*abort_job)(int exit_code), const char* rank_prefix);
void set_shared_error_handler(void (*finish_job)(), bool prints);

#define FATAL(...) fatal_error(nullptr, 0, __VA_ARGS__)
#define CHECK(cond, ...)                                                   \
  do {                                                                     \
    if (!(cond)) fatal_error(nullptr, 0, __VA_ARGS__);                     \
  } while (0)
#define FATAL_ALL(...) fatal_all_ranks(__VA_ARGS__)
#define CHECK_ALL(cond, ...)                                               \
  do {                                                                     \
    if (!(cond)) fatal_all_ranks(__VA_ARGS__);                             \
  } while (0)
#define BUG(...) fatal_error(__FILE__, __LINE__, "internal error: " __VA_ARGS__)

// Element types of stored tensors. Master weights, Adam moments and weight gradients are always
// F32; activations and the working copy of the weights use the compute dtype ([precision]).
// E4M3 and E5M2 are FP8 storage (kernels/fp8.h): GEMM operands only, never a compute dtype.
// I8 and I32 are payloads of the compressed gradient reductions (parallel/grad_compression.cu:
// int8 codes, top-k indices): moved by collectives, never summed by them, never a compute dtype.
enum class DType : int { F32 = 0, BF16 = 1, E4M3 = 2, E5M2 = 3, I8 = 4, I32 = 5 };
// A switch, not a ternary, in every place that maps a DType: a third type (FP8) must stop the
// program where nobody handled it, never quietly pass as bf16.
size_t dtype_size(DType t);
const char* dtype_name(DType t);

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

// Element i of a host array of dtype dt, as a float.
float element_as_float(const void* data, size_t i, DType dt);

inline size_t round_up(size_t x, size_t m) { return (x + m - 1) / m * m; }
inline size_t ceil_div(size_t x, size_t m) { return (x + m - 1) / m; }

// The compressed gradient reductions' formats (kernels/ops_decls.h: int8_quantize, topk_select;
// parallel/grad_compression.cu), the same on both backends so that a plan counts the same bytes:
// int8 codes come in blocks of kQuantBlock values with one fp32 scale each; a chunk of chunk_n
// values travels as one record of its codes (padded to 4 bytes) and then its blocks' scales.
constexpr size_t kQuantBlock = 256;
inline size_t int8_record_bytes(size_t chunk_n) {
  return round_up(chunk_n, 4) + 4 * ceil_div(chunk_n, kQuantBlock);
}
// Top-k selection works through tiles of kTopkTile values; its device scratch, in bytes.
constexpr size_t kTopkTile = 4096;
inline size_t topk_scratch_bytes(size_t n) { return 4 * (264 + 4 * ceil_div(n, kTopkTile)); }
