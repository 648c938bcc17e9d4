// kernels/common.cpp - the fatal-error path shared by both backends (see common.h).
#include "kernels/common.h"

#include <cstdarg>
#include <cstdio>
#include <cstdlib>

namespace {
struct FatalHandler {
  void (*abort_job)(int) = nullptr;
  char prefix[32] = "";
};
FatalHandler& fatal_handler() {
  static FatalHandler handler;
  return handler;
}
}  // namespace

void set_fatal_handler(void (*abort_job)(int), const char* rank_prefix) {
  FatalHandler& h = fatal_handler();
  h.abort_job = abort_job;
  std::snprintf(h.prefix, sizeof(h.prefix), "%s", rank_prefix ? rank_prefix : "");
}

void fatal_error(const char* file, int line, const char* fmt, ...) {
  FatalHandler& h = fatal_handler();
  char msg[4096];
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(msg, sizeof(msg), fmt, args);
  va_end(args);
  std::fprintf(stderr, "%serror: %s (%s:%d)\n", h.prefix, msg, file, line);
  std::fflush(stderr);
  std::fflush(stdout);
  if (h.abort_job) h.abort_job(1);
  std::exit(1);
}
