// parallel/grad_compression.cu - compressed data-parallel gradient reductions with error
// feedback ([parallel] grad_compression = "int8" | "topk", topk_ratio), for DDP's all-reduce
// (parallel/ddp.cu) and ZeRO-1/2's reduce-scatter (parallel/zero.cu, parallel/fsdp.cu's gradient
// half), on every axis (tp with or without SP, pp, cp, experts with ep, Llama; "The other axes"
// below says why each is right). FSDP (ZeRO-3) is refused by the config checks.
//
// The idea. When the dp links are slow, send fewer bits per gradient and keep what was not sent:
// each rank holds a residual e (fp32, as long as its bucket) and reduces x = g + e instead of g;
// whatever of x the compressed message does not carry stays in e for the next step. Nothing is
// lost, only delayed: over any number of steps,
//
//     sum over steps of (what the reduction delivered) + sum over ranks of e = sum of all g
//
// (exactly in real arithmetic; each addition rounds once in fp32). This "error feedback" is what
// makes biased compressors such as top-k converge (Stich et al. 2018, Karimireddy et al. 2019).
//
// int8 (per block of kQuantBlock = 256 values one fp32 scale, absmax / 127; the exact formula in
// kernels/ops_decls.h: int8_quantize). The bucket of n values is cut into c.size chunks of
// chunk_n = ceil(n / size) (the residual is padded with zeros to size * chunk_n):
//   1. e += g; quantise all chunks of e into one record each (codes, then scales); e = the
//      quantisation error (this rank's own feedback);
//   2. all-to-all: record j goes to rank j, so rank r holds every rank's record of chunk r;
//   3. rank r dequantises and sums them in fp32, in rank order: chunk r of the reduction.
//   ZeRO-1/2 stop here (chunk r is rank r's shard: chunk_n = shard_n). DDP goes on:
//   4. rank r requantises its sum, and adds that second quantisation error to its residual at
//      chunk r (so the identity above also holds for the all-reduce: the owner sends it again
//      next step);
//   5. all-gather of the requantised records; every rank dequantises all chunks: the sum.
// top-k (k = round(topk_ratio * n), at least 1): e += g; each rank selects the k largest |e|
// (ties: the lower index) into one record (k int32 indices, then k fp32 values) and zeroes
// them in e; all-gather the records; every rank adds them into a zeroed result, in rank order
// (DDP: the whole bucket; ZeRO: only the indices inside its shard).
//
// Who sends what, bytes per rank per bucket of n fp32 values over N ranks, payload as
// parallel/comm.h counts it (all-to-all: the send buffer; all-gather: the gathered output), with
// R = ceil(n/N) rounded up to 4 + 4 ceil(ceil(n/N) / 256) the bytes of one record:
//
//   method   DDP (all-reduce)                       ZeRO-1/2 (reduce-scatter)
//   none     all-reduce 4n                          reduce-scatter 4n
//   int8     all-to-all N R + all-gather N R        all-to-all N R
//   topk     all-gather 8 N k                       all-gather 8 N k
//
// (compressed_payload_bytes computes the table; the step's records and summary give it per axis
// and test/test_grad_compression.py holds it to the counted bytes.) On the wire, per rank, a ring
// moves 2(N-1)/N of an all-reduce's payload and (N-1)/N of the others', so:
//
//   method   DDP on the wire             ZeRO-1/2 on the wire       vs fp32
//   none     8n (N-1)/N                  4n (N-1)/N                 1
//   int8     about 2n (N-1)/N            about n (N-1)/N            about 1/4 (+ 1/64 for scales)
//   topk     8 k (N-1)                   8 k (N-1)                  ratio N (DDP), 2 ratio N (ZeRO)
//
// so top-k beats int8 below ratio ~ 1/(4N) (DDP). ZeRO-2 reduces every micro-batch, each with its
// own error feedback.
//
// The other axes. A compressed reduction runs wherever the plain one ran: per unit over the unit's
// gradient group us.group (parallel/placement.h ParamUnit::grad_axis), so on every layout it
// replaces exactly one linear sum, and error feedback keeps what it did not send. What follows it
// must stay linear in what it delivered, and the copies of one weight must receive the same
// update:
//   cp       the dense units' group is dp x cp (each cp rank saw other tokens): one compressed
//            reduction over dp*cp ranks. Nothing follows it.
//   experts  an MoE block's experts are summed over the dp*cp/ep ranks holding the same ones
//            (ep-dp; a group of one when ep = dp*cp: nothing to compress); the router lives in
//            the block's dense unit, over dp. Each group compresses alone.
//   pp       each stage compresses its own units over its dp group. The tied root is held by the
//            first and the last stage, each with its half of the gradient (lookups, head); the
//            two compressed dp sums are added over the pair afterwards (grads_wait): a sum of
//            two reductions, linear, so both copies get the same total and each rank's residual
//            keeps its own half's error.
//   tp       every tp rank reduces its own bucket over its own dp group. Three kinds of elements
//            share a bucket: split (different per tp rank, each its own weights: fine),
//            partial sums under sequence parallelism (LayerNorms, the router, the experts: each
//            tp rank saw N/tp tokens) summed over tp after the dp reduction (grads_wait) - a
//            linear sum of compressed sums, fine - and replicated complete ones (row-parallel
//            biases, wpe, LayerNorms without SP): the same gradient on every tp rank. Those are
//            the trap. Their compression depends on the rest of the bucket (an int8 block's
//            scale is its absmax, top-k selects over the whole bucket), which differs per tp
//            rank, so each tp rank would apply a different approximation to the same weight and
//            the replicas would drift apart from step 1. So in a unit that mixes them with split
//            or partial elements, tp rank 0 alone feeds them in (the others zero them first:
//            bucket_owner_only below) and they join the partial
//            sums' all-reduce over tp after the reduction (UnitState::tp_sum_begin): every tp
//            rank receives rank 0's result. A unit that is replicated complete throughout (the
//            experts without SP) compresses the same bucket on every tp rank and needs nothing.
//            Cost: 4 bytes per such element per step over tp (biases and wpe: small).
//            [log] check_replicas makes the trainer compare the replicas after every step.
//   Llama    the same units with other tensors (RMSNorm weights as LayerNorms; untied: the
//            embedding and the head are units of their own, no tied sum).
// test/test_grad_compression.py holds each of these layouts to its uncompressed run, its counted
// bytes and bitwise resumes.
//
// The residual is state: it is part of the checkpoint, per rank (checkpoint/), and dropped with
// a warning when the checkpoint was written with a different layout (compression, every degree,
// the ZeRO stage, the islands and, under pp, the blocks each stage holds: residual_layout,
// checkpoint/hdf5_format.h).
#include "parallel/grad_compression.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "parallel/param_store.h"

GradCompression grad_compression_kind(const std::string& s) {
  if (s == "none" || s.empty()) return GradCompression::None;
  if (s == "int8") return GradCompression::Int8;
  if (s == "topk") return GradCompression::Topk;
  BUG("[parallel] grad_compression = \"%s\"", s.c_str());
}

const char* grad_compression_name(GradCompression k) {
  switch (k) {
    case GradCompression::None: return "none";
    case GradCompression::Int8: return "int8";
    case GradCompression::Topk: return "topk";
  }
  BUG("grad compression %d", (int)k);
}

size_t topk_count(size_t n, double ratio) {
  const size_t k = (size_t)std::llround(ratio * (double)n);
  return std::min(n, std::max<size_t>(1, k));
}

size_t int8_chunk(size_t n, int ranks) { return ceil_div(n, (size_t)ranks); }

size_t residual_numel(GradCompression k, size_t n, int ranks) {
  if (k == GradCompression::None) return 0;
  return k == GradCompression::Int8 ? int8_chunk(n, ranks) * ranks : n;
}

void grad_compressor_need(GradCompressor& gc, size_t n, int ranks) {
  if (gc.kind == GradCompression::None || ranks < 2) return;
  if (gc.kind == GradCompression::Int8) {
    const size_t records = ranks * int8_record_bytes(int8_chunk(n, ranks));
    gc.send_bytes = std::max(gc.send_bytes, records);
    gc.recv_bytes = std::max(gc.recv_bytes, records);
    gc.sum_bytes = std::max(gc.sum_bytes, int8_chunk(n, ranks) * sizeof(float));
  } else {
    const size_t record = 2 * topk_count(n, gc.topk_ratio) * sizeof(int32_t);
    gc.send_bytes = std::max(gc.send_bytes, record);
    gc.recv_bytes = std::max(gc.recv_bytes, ranks * record);
    gc.scratch_bytes = std::max(gc.scratch_bytes, topk_scratch_bytes(n));
  }
}

void grad_compressor_allocate(GradCompressor& gc, Allocator& memory) {
  if (gc.send_bytes) gc.send = allocate(memory, gc.send_bytes);
  if (gc.recv_bytes) gc.recv = allocate(memory, gc.recv_bytes);
  if (gc.sum_bytes) gc.chunk_sum = (float*)allocate(memory, gc.sum_bytes);
  if (gc.scratch_bytes) gc.topk_scratch = allocate(memory, gc.scratch_bytes);
}

size_t compressed_payload_bytes(GradCompression k, double topk_ratio, size_t n, int ranks,
                                bool all_reduce) {
  if (k == GradCompression::None) return 4 * n;
  if (k == GradCompression::Topk) return 8 * ranks * topk_count(n, topk_ratio);
  const size_t exchange = ranks * int8_record_bytes(int8_chunk(n, ranks));
  return all_reduce ? 2 * exchange : exchange;
}

// ---------------------------------------------------------------------------------------------
// int8
// ---------------------------------------------------------------------------------------------
// Steps 1-3: e += x (n values), e quantised in c.size chunks of chunk_n, exchanged; this rank's
// chunk of the sum into `sum`.
static void int8_exchange(GradCompressor& gc, Comm& c, const float* x, size_t n, float* residual,
                          size_t chunk_n, float* sum, ops::Stream s) {
  ops::add_inplace(residual, x, n, s);
  ops::int8_quantize(gc.send, residual, residual, chunk_n, c.size, false, s);
  all_to_all(c, gc.send, gc.recv, int8_record_bytes(chunk_n), DType::I8, s);
  ops::int8_dequantize_sum(sum, gc.recv, chunk_n, c.size, s);
}

static void int8_all_reduce(GradCompressor& gc, Comm& c, float* grad, float* residual, size_t n,
                            ops::Stream s) {
  const size_t chunk_n = int8_chunk(n, c.size);
  int8_exchange(gc, c, grad, n, residual, chunk_n, gc.chunk_sum, s);
  ops::int8_quantize(gc.send, residual + c.rank * chunk_n, gc.chunk_sum, chunk_n, 1, true, s);
  all_gather(c, gc.send, gc.recv, int8_record_bytes(chunk_n), DType::I8, s);
  ops::int8_dequantize(grad, n, gc.recv, chunk_n, c.size, s);
}

// ---------------------------------------------------------------------------------------------
// top-k
// ---------------------------------------------------------------------------------------------
// e += x (n values); this rank's k largest |e| leave e; every rank's records land in gc.recv.
static size_t topk_exchange(GradCompressor& gc, Comm& c, const float* x, size_t n,
                            float* residual, ops::Stream s) {
  const size_t k = topk_count(n, gc.topk_ratio);
  ops::add_inplace(residual, x, n, s);
  ops::topk_select((int32_t*)gc.send, residual, n, k, gc.topk_scratch, s);
  all_gather(c, gc.send, gc.recv, 2 * k, DType::I32, s);
  return k;
}

// ---------------------------------------------------------------------------------------------
// The two reductions
// ---------------------------------------------------------------------------------------------
void compressed_all_reduce(GradCompressor& gc, Comm& c, float* grad, float* residual, size_t n,
                           ops::Stream s) {
  CHECK(gc.kind != GradCompression::None, "compressed_all_reduce without a compression");
  if (c.size < 2) return;
  if (gc.kind == GradCompression::Int8) return int8_all_reduce(gc, c, grad, residual, n, s);
  const size_t k = topk_exchange(gc, c, grad, n, residual, s);
  ops::fill_zero(grad, n * sizeof(float), s);
  ops::topk_scatter_add(grad, 0, n, (const int32_t*)gc.recv, k, c.size, s);
}

void compressed_reduce_scatter(GradCompressor& gc, Comm& c, const float* full, float* residual,
                               float* shard, size_t shard_n, ops::Stream s) {
  CHECK(gc.kind != GradCompression::None, "compressed_reduce_scatter without a compression");
  const size_t n = shard_n * c.size;
  if (c.size < 2) {
    if (shard != full) ops::copy_on_device(shard, full, shard_n * sizeof(float), s);
    return;
  }
  if (gc.kind == GradCompression::Int8)
    return int8_exchange(gc, c, full, n, residual, shard_n, shard, s);
  const size_t k = topk_exchange(gc, c, full, n, residual, s);
  ops::fill_zero(shard, shard_n * sizeof(float), s);
  ops::topk_scatter_add(shard, c.rank * shard_n, shard_n, (const int32_t*)gc.recv, k, c.size, s);
}

// ---------------------------------------------------------------------------------------------
// The store's buckets
// ---------------------------------------------------------------------------------------------
// Under tp: before unit u's bucket (its full gradient, unit-relative) enters the compressed dp
// reduction, tp ranks other than 0 zero its replicated complete range [owner_only_begin,
// partial_begin); grads_wait sums it over tp afterwards (tp_sum_begin). On the comm stream.
static void bucket_owner_only(ParamStore& st, int unit, float* bucket) {
  const UnitState& us = st.units[unit];
  const size_t first = st.compression.owner_only_begin[unit];
  if (st.tp->rank == 0 || first >= us.partial_begin) return;
  ops::fill_zero(bucket + first, (us.partial_begin - first) * sizeof(float), st.comm);
}

// DDP's bucket, all-reduced with this rank's residual.
static void compressed_bucket_all_reduce(ParamStore& st, int unit, float* bucket) {
  CompressedGrads& cg = st.compression;
  const UnitState& us = st.units[unit];
  bucket_owner_only(st, unit, bucket);
  compressed_all_reduce(cg.compressor, *us.group, bucket, cg.residual[unit], us.numel, st.comm);
}

// ZeRO-1/2's bucket (the padded unit), reduce-scattered with this rank's residual.
static void compressed_bucket_reduce_scatter(ParamStore& st, int unit, float* full,
                                             float* shard) {
  CompressedGrads& cg = st.compression;
  const UnitState& us = st.units[unit];
  bucket_owner_only(st, unit, full);
  compressed_reduce_scatter(cg.compressor, *us.group, full, cg.residual[unit], shard,
                            us.shard_numel, st.comm);
}

// A zero residual per unit whose group has two ranks or more, as long as the bucket the unit
// reduces (DDP: the unit; ZeRO-1/2: the padded unit), and the scratch of the largest one.
void grad_compression_init(ParamStore& st) {
  if (!store_compressed(st)) return;
  CHECK(st.mode != ShardingMode::FSDP, "[parallel] grad_compression works with zero = 0, 1 or 2");
  CompressedGrads& cg = st.compression;
  cg.residual.assign(st.units.size(), nullptr);
  cg.residual_numel.assign(st.units.size(), 0);
  cg.owner_only_begin.clear();
  for (UnitState& us : st.units) cg.owner_only_begin.push_back(us.partial_begin);
  for (size_t u = 0; u < st.units.size(); u++) {
    UnitState& us = st.units[u];
    const size_t n = st.mode == ShardingMode::Replicated ? us.numel : us.padded_numel;
    if (us.group->size < 2) continue;
    // Replicated complete tensors beside tp-specific ones (split, or partial sums): the
    // compression of a bucket depends on all of it (int8 block scales, top-k's selection), so
    // the tp ranks would send different approximations of the same gradient and their replicas
    // would drift apart. Tp rank 0 alone feeds them in, and the sum over tp hands them out.
    const bool mixed = us.replicated_begin > 0 || us.partial_begin < us.numel;
    if (st.tp->size > 1 && mixed && us.replicated_begin < us.partial_begin)
      cg.owner_only_begin[u] = us.tp_sum_begin = us.replicated_begin;
    cg.residual_numel[u] = residual_numel(cg.compressor.kind, n, us.group->size);
    cg.residual[u] = (float*)allocate_zeroed(st.state_memory, cg.residual_numel[u] * sizeof(float),
                                             st.compute);
    grad_compressor_need(cg.compressor, n, us.group->size);
  }
  grad_compressor_allocate(cg.compressor, st.work_memory);
  st.reduction.all_reduce = compressed_bucket_all_reduce;
  st.reduction.reduce_scatter = compressed_bucket_reduce_scatter;
}

std::string grad_compression_banner(const ParamStore& st) {
  if (!store_compressed(st)) return "";
  const GradCompressor& gc = st.compression.compressor;
  size_t residual = 0;
  for (size_t n : st.compression.residual_numel) residual += n * sizeof(float);
  char ratio[48] = "";
  if (gc.kind == GradCompression::Topk)
    std::snprintf(ratio, sizeof(ratio), " (%g of each bucket)", gc.topk_ratio);
  char line[256];
  std::snprintf(line, sizeof(line), "compress dp gradient reductions in %s%s with error feedback "
                "(parallel/grad_compression.cu): %.1f MiB of residuals on rank 0\n",
                grad_compression_name(gc.kind), ratio, residual / 1048576.0);
  return line;
}
