// parallel/grad_compression.h - compressed data-parallel gradient reductions with error feedback
// ([parallel] grad_compression = "int8" | "topk"): the algorithm, who sends what and the bytes
// per step are at the top of parallel/grad_compression.cu.
#pragma once
#include <string>
#include <vector>

#include "kernels/allocator.h"
#include "kernels/ops.h"
#include "parallel/comm.h"

enum class GradCompression { None = 0, Int8, Topk };
GradCompression grad_compression_kind(const std::string& s);  // "none" | "int8" | "topk"
const char* grad_compression_name(GradCompression k);

// The scratch of one process's compressed reductions, sized for its largest bucket: the packed
// records it sends and receives, one chunk's fp32 sum (int8), top-k's selection scratch.
struct GradCompressor {
  GradCompression kind = GradCompression::None;
  double topk_ratio = 0.01;
  size_t send_bytes = 0, recv_bytes = 0, sum_bytes = 0, scratch_bytes = 0;
  void* send = nullptr;        // this rank's records
  void* recv = nullptr;        // every rank's records
  float* chunk_sum = nullptr;  // int8: the sum of this rank's chunk
  void* topk_scratch = nullptr;
};

// Elements top-k sends of a bucket of n: round(ratio * n), at least 1, at most n.
size_t topk_count(size_t n, double ratio);
// int8 cuts a bucket of n elements over `ranks` ranks into chunks of this many (the last ranks'
// chunks end in zero padding): ceil(n / ranks).
size_t int8_chunk(size_t n, int ranks);
// The residual a bucket of n elements keeps per rank (elements): int8 pads to ranks chunks.
size_t residual_numel(GradCompression k, size_t n, int ranks);
// The scratch: grad_compressor_need for every bucket (n elements over `ranks` ranks), then
// grad_compressor_allocate from `memory` (counted by the planner like every other buffer).
void grad_compressor_need(GradCompressor& gc, size_t n, int ranks);
void grad_compressor_allocate(GradCompressor& gc, Allocator& memory);

// Payload bytes one compressed reduction of a bucket of n elements puts through the collectives
// per rank, as parallel/comm.h counts them (all-to-all: its send buffer; all-gather: its output).
// all_reduce: DDP's (int8: all-to-all then all-gather; topk: one all-gather); else ZeRO's
// reduce-scatter (int8: the all-to-all only).
size_t compressed_payload_bytes(GradCompression k, double topk_ratio, size_t n, int ranks,
                                bool all_reduce);

// DDP: grad (n floats) becomes the compressed sum over the group of every rank's grad plus its
// residual; the residual (residual_numel floats, zero at first) keeps what was not sent. On a
// one-rank group: nothing to do.
void compressed_all_reduce(GradCompressor& gc, Comm& c, float* grad, float* residual, size_t n,
                           ops::Stream s);
// ZeRO-1/2: `full` holds c.size * shard_n floats; the compressed sum of block c.rank over the
// group lands in `shard` (may lie inside `full`). The residual holds c.size * shard_n floats.
void compressed_reduce_scatter(GradCompressor& gc, Comm& c, const float* full, float* residual,
                               float* shard, size_t shard_n, ops::Stream s);

// ---------------------------------------------------------------------------------------------
// In the parameter store: the compressed bucket reductions of DDP, ZeRO-1 and ZeRO-2
// ---------------------------------------------------------------------------------------------
struct ParamStore;

// The state of [parallel] grad_compression in the store (ParamStore::compression).
struct CompressedGrads {
  GradCompressor compressor;  // kind and topk_ratio: set before param_store_init (store_options)
  // Per unit: what this rank's compressed reductions have not sent yet, residual_numel floats on
  // the device; null for a unit whose group has one rank. Checkpointed per rank (checkpoint/).
  std::vector<float*> residual;
  std::vector<size_t> residual_numel;
  // Per unit, under tp: [owner_only_begin, partial_begin) - replicated complete elements beside
  // tp-specific ones - enters the compressed reduction on tp rank 0 only (zeros elsewhere), and
  // the sum over tp after the step hands it out (the top of grad_compression.cu says why).
  std::vector<size_t> owner_only_begin;
  // Unit u's residual and its length (null and 0 where there is none).
  float* residual_at(size_t u) const { return u < residual.size() ? residual[u] : nullptr; }
  size_t residual_numel_at(size_t u) const {
    return u < residual_numel.size() ? residual_numel[u] : 0;
  }
};

// param_store_init, after the mode's buffers: the residuals and the scratch, and the store's
// BucketReduction set to the compressed one. Nothing without a compression.
void grad_compression_init(ParamStore& store);
// The banner's line ("compress ..."), empty without a compression.
std::string grad_compression_banner(const ParamStore& store);
