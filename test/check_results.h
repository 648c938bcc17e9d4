// test/check_results.h - pass/fail bookkeeping shared by the C++ test programs: every check is
// counted; a failure prints "FAIL <message>", and with `verbose` a success prints "ok   <message>".
// The program then returns exit_status(): 1 if any check failed.
//
// One check alone (test/README.md, "Running one check"): with the environment variable
// TEST_ONLY=PATTERN (test/run_all.sh GROUP --only PATTERN sets it) a check counts only when
// PATTERN occurs in its message (plain substring, case-sensitive); the others are counted as
// filtered out, never as passed. A check's message is built after its work, so a program that
// wants to skip the work itself asks wanted(name) before it: true when there is no filter, or
// the name and the pattern are one inside the other ("gpipe p=2" runs the unit "gpipe p=2 m=4"
// and the unit "gpipe" both). exit_status() prints what the filter left out, and fails a
// filtered run in which no check matched.
#pragma once
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

struct Results {
  int failures = 0, checks = 0;
  int filtered = 0, skipped_units = 0;  // left out by TEST_ONLY: checks run, units not run
  bool verbose = true;
  const char* only = filter_pattern();

  static const char* filter_pattern() {
    const char* p = std::getenv("TEST_ONLY");
    return p && *p ? p : nullptr;
  }

  // Whether the unit of work `name` runs under the filter; ask before doing the work.
  bool wanted(const char* name) {
    if (!only || std::strstr(name, only) || std::strstr(only, name)) return true;
    skipped_units++;
    return false;
  }

  void check(bool ok, const char* fmt, ...) __attribute__((format(printf, 3, 4))) {
    va_list args, again;
    va_start(args, fmt);
    va_copy(again, args);
    std::string msg(std::vsnprintf(nullptr, 0, fmt, args), '\0');
    std::vsnprintf(&msg[0], msg.size() + 1, fmt, again);
    va_end(again);
    va_end(args);
    if (only && msg.find(only) == std::string::npos) {
      filtered++;
      return;
    }
    checks++;
    failures += ok ? 0 : 1;
    if (ok && !verbose) return;
    std::printf("%s %s\n", ok ? "ok  " : "FAIL", msg.c_str());
  }

  // The program's exit status: 1 on any failure, or when a filter let no check through.
  int exit_status() const {
    if (!only) return failures ? 1 : 0;
    std::printf("TEST_ONLY=\"%s\": %d checks run, %d filtered out, %d units of work not run\n",
                only, checks, filtered, skipped_units);
    if (checks == 0) std::printf("FAIL no check matched TEST_ONLY=\"%s\"\n", only);
    return failures || checks == 0 ? 1 : 0;
  }
};
