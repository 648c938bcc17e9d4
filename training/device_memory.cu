// training/device_memory.cu - the planner's GPU-only memory terms (training/device_memory.h):
// constants, and the compute stream's largest scratch request from the CUDA kernels' formulas.
//
// The scratch requests of a training step, per kernel family (kernels/cuda/), with B the
// micro-batch, T the positions a rank holds (seq_len / cp), H the heads a rank holds (n_head /
// tp), HS the head size, C d_model, N = B x T token rows and N_ln the rows a LayerNorm sees (N / tp
// with sequence parallelism):
// - attention backward, hand-written (flash or generic) and ring blocks: the fp32 row sums D of
//   dout * out, B x H x T floats;
// - attention backward through cuDNN (bf16 or fp8 compute, [kernels] attention "cudnn" or "auto",
//   cp = 1 or cp_comm "all-to-all", where attention runs over whole sequences: the head-split
//   B x H/cp x T cp counts the same): D, then the fp32 dQ accumulator, B x H x T x HS floats, each 256-byte aligned, after
//   cuDNN's own engine workspace (its choice at run time, not planned);
// - LayerNorm backward: 2 x blocks x C fp32 partial sums of dweight and dbias, blocks =
//   min(ceil(N_ln / warps), 256), warps = min(8, max(1, 96 KiB / (8 C)));
// - the encoder's backward sort: three arrays of N ints (256-byte aligned) and CUB's temporary
//   storage, which CUB sizes; planned as two more such arrays;
// - the bias gradient's column sums: chunks x OC floats, at most (4 SMs x 64 + OC) floats at
//   bf16 (kPlannedSMs SMs), planned at the largest OC, 4C (with tp: 4C / tp);
// - the norm's and the sums' partials: at most 1024 floats.
// The largest of them is the scratch, rounded up to a MiB. The comm stream asks for none.
#include "training/device_memory.h"

#include <algorithm>

namespace {

size_t round_up_to(size_t x, size_t m) { return (x + m - 1) / m * m; }

struct Request {
  size_t bytes;
  const char* what;
};

// Every scratch request of the compute stream in a step, by the formulas above.
std::vector<Request> scratch_requests(const Config& c, const MeshShape& shape) {
  const ModelConfig& m = c.model;
  const size_t B = c.train.micro_batch, T = m.seq_len / shape.cp, H = m.n_head / shape.tp;
  const size_t C = m.d_model, HS = m.d_model / m.n_head, N = B * T;
  const size_t N_ln = c.parallel.sp && shape.tp > 1 ? N / shape.tp : N;
  const size_t warps = std::min<size_t>(8, std::max<size_t>(1, 96 * 1024 / (8 * C)));
  const size_t ln_blocks = std::min<size_t>((N_ln + warps - 1) / warps, 256);
  const size_t ints = round_up_to(N * sizeof(int), 256);
  const size_t OC = 4 * C / shape.tp;
  std::vector<Request> r = {
      {B * H * T * sizeof(float), "attention backward's row sums"},
      {2 * ln_blocks * C * sizeof(float), "LayerNorm backward's partial sums"},
      {5 * ints, "the encoder backward's sort"},
      {((size_t)4 * kPlannedSMs * 64 + OC) * sizeof(float), "the bias gradient's column sums"},
      {1024 * sizeof(float), "the reductions' partials"}};
  const bool cudnn = c.precision.compute != "fp32" && c.kernels.attention != "flash" &&
                     (shape.cp == 1 || shape.cp_a2a == shape.cp);
  if (cudnn)
    r.push_back({round_up_to(B * H * T * sizeof(float), 256) +
                     round_up_to(B * H * T * HS * sizeof(float), 256),
                 "cuDNN attention backward's fp32 dQ accumulator"});
  return r;
}

// NCCL communicators of a rank: one per group of more than one rank, and one per extra tag.
int nccl_communicators(const Mesh& mesh) {
  int n = 0;
  for (const Comm& g : mesh.groups)
    if (g.size > 1) n += std::max(1, g.tags);
  return n;
}

}  // namespace

GpuMemoryTerms gpu_memory_terms(const Config& c, const Mesh& mesh) {
  GpuMemoryTerms t;
  t.cublas_workspace = kStreamsPerRank * kCublasWorkspaceBytes;
  for (const Request& r : scratch_requests(c, mesh.shape))
    if (r.bytes > t.scratch_request) t.scratch_request = r.bytes, t.scratch_what = r.what;
  t.scratch = round_up_to(t.scratch_request, kMiBytes);
  t.nccl_communicators = nccl_communicators(mesh);
  t.nccl = t.nccl_communicators * kNcclCommunicatorBytes;
  t.context = kCudaContextBytes;
  return t;
}
