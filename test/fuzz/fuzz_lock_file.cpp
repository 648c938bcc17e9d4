// test/fuzz/fuzz_lock_file.cpp - a checkpoint directory's lock file (checkpoint/dir_lock.h): the
// holder line a job refused by it prints (lock_holder_describe), for any bytes a crashed or
// foreign writer may have left there; and the line a holder writes, described back to itself.
#include <string>

#include "checkpoint/files.h"
#include "test/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz_catch_stops();
  try {
    lock_holder_describe(std::string((const char*)data, size));
    const std::string own = lock_holder_text(1 + (size > 0 ? data[0] : 0));
    if (lock_holder_describe(own).compare(0, 5, "host ") != 0) __builtin_trap();
  } catch (const FuzzStop&) {
  }
  return 0;
}
