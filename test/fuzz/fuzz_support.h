// test/fuzz/fuzz_support.h - what the fuzz targets share (test/fuzz/README.md). Each target is a
// libFuzzer entry point over one of the trainer's readers, built with AddressSanitizer and
// UndefinedBehaviorSanitizer (test/fuzz/fuzz.mk).
//
// The readers stop the program on bad input (FATAL, FATAL_ALL: kernels/common.h), which is their
// contract; a fuzz target must instead go on to the next input. So the targets install error
// hooks that throw FuzzStop, which unwinds back to the entry point: a refusal is a pass, and only
// a crash, a sanitizer report, a hang or an unbounded allocation is a failure.
//
// Readers that take a path get the input written to a file in this process's own temporary
// directory (kept for the process's life, removed at exit).
#pragma once
#include <stdlib.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "kernels/common.h"

struct FuzzStop {};

[[noreturn]] inline void fuzz_stop_one(int) { throw FuzzStop{}; }
[[noreturn]] inline void fuzz_stop_all() { throw FuzzStop{}; }

// FATAL and FATAL_ALL throw FuzzStop (FATAL_ALL without printing; FATAL prints its message).
inline void fuzz_catch_stops() {
  set_fatal_handler(fuzz_stop_one, "");
  set_shared_error_handler(fuzz_stop_all, false);
}

// This process's scratch directory.
inline const std::string& fuzz_dir() {
  static const std::string dir = [] {
    char tmpl[] = "/tmp/gpt5d_fuzz_XXXXXX";
    const char* made = mkdtemp(tmpl);
    if (!made) std::abort();
    std::string d = made;
    static std::string removed = d;
    std::atexit([] { std::system(("rm -rf '" + removed + "'").c_str()); });
    return d;
  }();
  return dir;
}

// Writes the input to fuzz_dir()/name and returns the path.
inline std::string fuzz_file(const std::string& name, const uint8_t* data, size_t size) {
  const std::string path = fuzz_dir() + "/" + name;
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) std::abort();
  if (size > 0 && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
  return path;
}
