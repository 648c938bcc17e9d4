// test/emu/test_cudnn.cpp - kernels/cuda/attention_cudnn.cu, compiled by g++ and linked with the
// cuDNN stand-in (test/emu/lib/cudnn.cpp), must conclude that cuDNN cannot run attention, say so,
// and touch nothing: what the emulated trainer relies on to take the flash kernels.
//
//   test_cudnn          exit 1 on a failure
//
// Checks: cudnn_sdpa::applies is true for the bf16 head sizes the trainer uses (so "auto" really
// asks cuDNN); forward and backward return false with a reason naming CUDNN_STATUS_NOT_SUPPORTED
// and the stand-in, twice (the second time from the plan cache), without ever asking for scratch
// memory or clearing the dQ accumulator (both would mean a plan was believed to exist) and without
// writing to the output buffers; every tensor and operation of both graphs is still built
// (describe_graph: 14 and 22 operations, test/test_cudnn_graph.cu's counts); releasing the
// stream's state destroys the handle and leaves no plans behind.
//
// attention_cudnn.cu includes kernels/cuda/cuda_common.cuh, whose inline device helpers name two
// device intrinsics that only nvcc declares. They are declared here, never defined: nothing on
// this host path calls them (the emulator core's header provides them in the emulated build).
#include <cuda_runtime.h>

int4 __ldcs(const int4* p);
float __shfl_xor_sync(unsigned mask, float value, int lane_mask, int width = 32);

#include "kernels/cuda/attention_cudnn.cu"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

// The two device-memory calls attention_cudnn.cu makes once it has a plan. With the stand-in
// there is never a plan, so reaching either is a failure.
namespace ops {
void* stream_scratch(Stream, size_t bytes) {
  std::fprintf(stderr, "FAIL stream_scratch(%zu) called: a cuDNN plan was believed to exist\n", bytes);
  std::exit(1);
}
}  // namespace ops
cudaError_t cudaMemsetAsync(void*, int, size_t, cudaStream_t) {
  std::fprintf(stderr, "FAIL cudaMemsetAsync called: a cuDNN plan was believed to exist\n");
  std::exit(1);
}

namespace {

int failures = 0;
void expect(bool ok, const std::string& what) {
  if (!ok) ++failures;
  std::printf("%s %s\n", ok ? "ok  " : "FAIL", what.c_str());
}

bool says_not_supported(const std::string& why) {
  return why.find("CUDNN_STATUS_NOT_SUPPORTED") != std::string::npos &&
         why.find("stand-in") != std::string::npos;
}

void check_direction(ops::StreamImpl* s, bool backward, int B, int T, int NH, int HS) {
  const size_t C = (size_t)NH * HS, rows = (size_t)B * T;
  // 16-byte aligned (vector storage comes from operator new), filled with a pattern.
  std::vector<uint16_t> qkv(3 * rows * C, 0x3F80), out(rows * C, 0x5A5A), dout(rows * C, 0x3F80);
  std::vector<uint16_t> dqkv(3 * rows * C, 0x5A5A);
  std::vector<float> lse(rows * NH, 0.0f);
  const std::vector<uint16_t> out_before = out, dqkv_before = dqkv;
  const char* name = backward ? "backward" : "forward";
  for (int call = 0; call < 2; call++) {
    std::string why;
    const bool ran =
        backward ? ops::cudnn_sdpa::backward(s, dqkv.data(), dout.data(), qkv.data(), out.data(),
                                             lse.data(), B, T, NH, HS, &why)
                 : ops::cudnn_sdpa::forward(s, out.data(), lse.data(), qkv.data(), B, T, NH, HS,
                                            &why);
    expect(!ran && says_not_supported(why),
           std::string(name) + (call ? " (cached plan)" : "") + " reports cuDNN cannot run: " + why);
  }
  expect(out == out_before && dqkv == dqkv_before,
         std::string(name) + " wrote nothing");
}

}  // namespace

int main() {
  alignas(16) static uint16_t buffer[64];
  expect(ops::cudnn_sdpa::applies(64, DType::BF16, {buffer}) &&
             ops::cudnn_sdpa::applies(128, DType::BF16, {buffer}),
         "cuDNN applies to bf16 heads of 64 and 128 (so \"auto\" asks it)");
  ops::StreamImpl stream;
  check_direction(&stream, false, 2, 37, 3, 64);
  check_direction(&stream, true, 2, 37, 3, 64);
  check_direction(&stream, false, 1, 16, 2, 128);
  for (bool backward : {false, true}) {
    int operations = 0;
    std::string error;
    const bool built = ops::cudnn_sdpa::describe_graph(backward, 2, 37, 3, 64, &operations, &error);
    expect(built && operations == (backward ? 22 : 14),
           std::string(backward ? "backward" : "forward") + " graph built: " +
               std::to_string(operations) + " operations " + error);
  }
  ops::cudnn_sdpa::release_stream_state(&stream);
  expect(stream.cudnn_plans == nullptr, "release_stream_state drops the plans and the handle");
  std::printf("test_cudnn: %d failures\n", failures);
  return failures == 0 ? 0 : 1;
}
