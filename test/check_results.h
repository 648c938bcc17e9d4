// test/check_results.h - pass/fail bookkeeping shared by the C++ test programs: every check is
// counted; a failure prints "FAIL <message>", and with `verbose` a success prints "ok   <message>".
// The program then exits 1 if failures > 0.
#pragma once
#include <cstdarg>
#include <cstdio>

struct Results {
  int failures = 0, checks = 0;
  bool verbose = true;
  void check(bool ok, const char* fmt, ...) __attribute__((format(printf, 3, 4))) {
    checks++;
    failures += ok ? 0 : 1;
    if (ok && !verbose) return;
    va_list args;
    va_start(args, fmt);
    std::printf("%s ", ok ? "ok  " : "FAIL");
    std::vprintf(fmt, args);
    std::printf("\n");
    va_end(args);
  }
};
