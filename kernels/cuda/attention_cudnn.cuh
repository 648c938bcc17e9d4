// kernels/cuda/attention_cudnn.cuh - the optional cuDNN SDPA path of ops::attention_forward and
// attention_backward (kernels/cuda/attention_cudnn.cu). Each call returns false when cuDNN cannot
// run this shape on this device (no engine accepts the graph); `why` then says what cuDNN
// reported, and the caller falls back to the hand-written kernels.
#pragma once
#include <string>

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

// Frees the stream's cached execution plans and its cuDNN handle (called by stream_destroy).
void release_stream_state(StreamImpl* s);

}  // namespace cudnn_sdpa
}  // namespace ops
