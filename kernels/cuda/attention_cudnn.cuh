// kernels/cuda/attention_cudnn.cuh - the optional cuDNN SDPA path of ops::attention_forward and
// attention_backward (kernels/cuda/attention_cudnn.cu). Each call returns false when cuDNN cannot
// run this shape on this device (no engine accepts the graph); `why` then says what cuDNN
// reported, and the caller falls back to the hand-written kernels.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_common.cuh"

namespace ops {
namespace cudnn_sdpa {

// Shapes and dtypes the graph is built for: bf16, head size a multiple of 8 up to 128, 16-byte
// aligned base pointers (so that q, k and v, C elements apart, are aligned too).
bool applies(int HS, DType dt, std::initializer_list<const void*> pointers);

bool forward(Stream s, void* out, float* lse, const void* qkv, int B, int T, int NH, int HS,
             std::string* why);
bool backward(Stream s, void* dqkv, const void* dout, const void* qkv, const void* out,
              const float* lse, int B, int T, int NH, int HS, std::string* why);

// Builds one direction's graph without a GPU (no plan, no handle) so that CI can check that
// cuDNN accepts every tensor and operation descriptor: true when all finalize; *operations is
// how many operations the graph has, *error cuDNN's complaint otherwise.
bool describe_graph(bool backward, int B, int T, int NH, int HS, int* operations,
                    std::string* error);

// cuDNN's own verdict, without a GPU, on one direction's graph for a device described by
// `device_json` (the JSON form of a cuDNN device-properties descriptor; cuDNN >= 9.8 runs its
// heuristics and each engine's support check against one in place of a handle). Returns the
// global indices of the engines heuristics mode A offers, best first, having dropped those whose
// support check failed; empty with *error saying why if none. `variant` builds a deliberately
// altered forward graph for the negative test.
enum class GraphVariant { AsTrained, MaskAndMaxSwapped };
std::vector<int64_t> engines_for_described_device(bool backward, int B, int T, int NH, int HS,
                                                  const std::string& device_json,
                                                  GraphVariant variant, std::string* error);

// Frees the stream's cached execution plans and its cuDNN handle (called by stream_destroy).
void release_stream_state(StreamImpl* s);

}  // namespace cudnn_sdpa
}  // namespace ops
