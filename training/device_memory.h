// training/device_memory.h - the planner's device model of the GPU memory that no Allocator
// sees: what the CUDA backend and the libraries under it hold on a rank besides the model's,
// the parameter store's and the parallelisms' buffers (which the plan counts exactly by running
// the step dry, training/plan.cu).
//
// Four terms, each a documented constant or a formula over the layout's shapes:
// - cuBLASLt workspace: kernels/cuda/runtime.cu gives every stream a workspace of
//   kCublasWorkspaceBytes (32 MiB) through ops::alloc; the trainer makes two streams (compute and
//   comm, train.cu). Counted by ops::memory_peak.
// - stream scratch: the reductions, the encoder's sort and cuDNN's attention backward borrow a
//   per-stream scratch buffer (ops::stream_scratch) that grows to the largest request rounded up
//   to a whole MiB (kernels/cuda/runtime.cu). The planner sizes the compute stream's largest
//   request from the kernels' formulas (device_memory.cu). Counted by ops::memory_peak.
// - NCCL buffers: each NCCL communicator (one per mesh group of more than one rank, and one per
//   extra message channel the pipeline opens) holds its own transport buffers. NCCL's
//   documentation of its environment variables gives NCCL_BUFFSIZE, the buffer of the Simple
//   protocol per channel and connection, a default of 4 MiB; a ring connection receives from one
//   neighbour and sends to the other, and NCCL uses several channels (by topology; we assume
//   kNcclChannels). An estimate of the right order (NCCL_DEBUG=INFO prints the real figure);
//   not in ops::memory_peak (NCCL calls cudaMalloc itself).
// - the CUDA context: the driver's per-process state and the lazily loaded kernel modules of our
//   kernels, cuBLASLt and cuDNN (CUDA_MODULE_LOADING=LAZY, the default since CUDA 12.2): a few
//   hundred MiB on a Hopper GPU, what nvidia-smi shows for a process before its first cudaMalloc.
//   An estimate; not in ops::memory_peak.
// The emulated tier (./train_emu) has the first two exactly and neither of the last two:
// test/test_gpu_train.py requires its allocator peak to equal the plan's peak plus the first two.
#pragma once
#include <cstddef>
#include <string>

#include "config/config.h"
#include "parallel/mesh.h"

constexpr size_t kMiBytes = size_t(1) << 20;
constexpr size_t kCublasWorkspaceBytes = 32 * kMiBytes;  // per stream (kernels/cuda/runtime.cu)
constexpr int kStreamsPerRank = 2;                        // compute and comm (train.cu)
constexpr size_t kNcclBuffSizeBytes = 4 * kMiBytes;       // NCCL_BUFFSIZE's default
constexpr int kNcclChannels = 8;                          // assumed; NCCL picks 2-32 by topology
constexpr size_t kNcclCommunicatorBytes = kNcclChannels * 2 * kNcclBuffSizeBytes;  // 64 MiB
constexpr size_t kCudaContextBytes = 512 * kMiBytes;      // estimate (see above)
constexpr int kPlannedSMs = 132;                          // H100 SXM, for the bias reduction

struct GpuMemoryTerms {
  size_t cublas_workspace = 0;  // kStreamsPerRank x kCublasWorkspaceBytes
  size_t scratch_request = 0;   // the compute stream's largest scratch request
  std::string scratch_what;     // which kernel asks for it
  size_t scratch = 0;           // scratch_request rounded up to a whole MiB
  int nccl_communicators = 0;
  size_t nccl = 0;              // nccl_communicators x kNcclCommunicatorBytes
  size_t context = 0;           // kCudaContextBytes
  // What the backend's allocator counts on top of the Allocators (./train_emu has exactly this).
  size_t allocator() const { return cublas_workspace + scratch; }
  size_t total() const { return allocator() + nccl + context; }
};

// The terms of a rank of c's layout; `mesh` is that rank's (a Count mesh after the dry step, so
// that the pipeline's extra channels are open). The plan describes ./train over NCCL, its default,
// whatever binary plans it (./train and ./train_cpu print the same plan).
GpuMemoryTerms gpu_memory_terms(const Config& c, const Mesh& mesh);
