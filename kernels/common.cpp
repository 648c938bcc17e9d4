// kernels/common.cpp - the error paths shared by both backends (see common.h): FATAL aborts the
// job from the rank that failed; FATAL_ALL prints once and leaves every rank cleanly.
#include "kernels/common.h"
#include "kernels/fp8.h"

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace {
struct FatalHandler {
  void (*abort_job)(int) = nullptr;
  void (*finish_job)() = nullptr;
  bool prints_shared = true;  // this rank prints FATAL_ALL messages
  char prefix[32] = "";
};
FatalHandler& fatal_handler() {
  static FatalHandler handler;
  return handler;
}

// The whole formatted message, however long (a message naming a path near PATH_MAX twice, with
// the system's reason at its end, is longer than any fixed buffer).
std::string format_message(const char* fmt, va_list args) {
  va_list again;
  va_copy(again, args);
  const int n = std::vsnprintf(nullptr, 0, fmt, args);
  std::string msg(n > 0 ? (size_t)n : 0, '\0');
  if (n > 0) std::vsnprintf(&msg[0], (size_t)n + 1, fmt, again);
  va_end(again);
  return msg;
}
}  // namespace

void set_fatal_handler(void (*abort_job)(int), const char* rank_prefix) {
  FatalHandler& h = fatal_handler();
  h.abort_job = abort_job;
  std::snprintf(h.prefix, sizeof(h.prefix), "%s", rank_prefix ? rank_prefix : "");
}

void set_shared_error_handler(void (*finish_job)(), bool prints) {
  FatalHandler& h = fatal_handler();
  h.finish_job = finish_job;
  h.prints_shared = prints;
}

void fatal_error(const char* file, int line, const char* fmt, ...) {
  FatalHandler& h = fatal_handler();
  va_list args;
  va_start(args, fmt);
  const std::string msg = format_message(fmt, args);
  va_end(args);
  std::fflush(stdout);
  if (file) std::fprintf(stderr, "%serror: %s (%s:%d)\n", h.prefix, msg.c_str(), file, line);
  else std::fprintf(stderr, "%serror: %s\n", h.prefix, msg.c_str());
  std::fflush(stderr);
  if (h.abort_job) h.abort_job(1);
  std::exit(1);
}

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::BF16: return 2;
    case DType::E4M3: return 1;
    case DType::E5M2: return 1;
    case DType::I8: return 1;
    case DType::I32: return 4;
  }
  FATAL("unknown dtype %d", (int)t);
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "fp32";
    case DType::BF16: return "bf16";
    case DType::E4M3: return "e4m3";
    case DType::E5M2: return "e5m2";
    case DType::I8: return "int8";
    case DType::I32: return "int32";
  }
  FATAL("unknown dtype %d", (int)t);
}

float element_as_float(const void* data, size_t i, DType dt) {
  switch (dt) {
    case DType::F32: return ((const float*)data)[i];
    case DType::BF16: return bf16_to_f32(((const uint16_t*)data)[i]);
    case DType::E4M3: return fp8_to_f32(((const uint8_t*)data)[i], DType::E4M3);
    case DType::E5M2: return fp8_to_f32(((const uint8_t*)data)[i], DType::E5M2);
    case DType::I8: return (float)((const int8_t*)data)[i];
    case DType::I32: return (float)((const int32_t*)data)[i];
  }
  FATAL("unknown dtype %d", (int)dt);
}

void fatal_all_ranks(const char* fmt, ...) {
  FatalHandler& h = fatal_handler();
  std::fflush(stdout);
  if (h.prints_shared) {
    va_list args;
    va_start(args, fmt);
    const std::string msg = format_message(fmt, args);
    va_end(args);
    std::fprintf(stderr, "error: %s\n", msg.c_str());
    std::fflush(stderr);
  }
  if (h.finish_job) h.finish_job();
  std::exit(1);
}
