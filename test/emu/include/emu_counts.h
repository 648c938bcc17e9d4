// test/emu/include/emu_counts.h - how the library stand-ins report a call to the emulator's
// counter (test/emu/counts.cpp, EMU_COUNTS=path): a cuBLASLt GEMM's FLOPs and the bytes of its
// operands by their documented semantics, an NCCL call's payload. The stand-ins call
// note_library_call from the work they queue, when it runs, so a call is counted in the phase
// (micro-step, optimizer step) whose work it is. count_library_call is weak: the stand-ins' own
// tests link no emulator runtime, and there nothing is counted.
#pragma once
#include <string>

namespace emu {

struct LibraryCall {
  std::string name;     // "cublasLtMatmul 768x64x3072" (m x n x k [x batches]), "ncclAllReduce"
  double flops;         // 2 M N K per GEMM (times the batch); 0 for communication
  double bytes_read;    // device memory the call's documented semantics read once
  double bytes_written; // and write once
  double comm_bytes;    // NCCL: the payload (the call's largest buffer); 0 for a GEMM
};

void count_library_call(const LibraryCall& call) __attribute__((weak));

inline void note_library_call(const LibraryCall& call) {
  if (count_library_call) count_library_call(call);
}

}  // namespace emu
