// parallel/tensor_parallel_overlap.cu - [parallel] tp_overlap: sequence parallelism's
// collectives cut into tp chunks that travel on the communication stream while the GEMMs run on
// the pieces already here (Megatron's tp_comm_overlap, torchtitan's async TP). Tensor and
// sequence parallelism themselves (f and g, who holds which tokens) are at the top of
// parallel/tensor_parallel.cu; this file changes only when the bytes move, not which.
//
// The idea. Under SP a column-parallel GEMM needs every token's input, Y = X W_i^T with X the t
// ranks' token slices stacked, X = [X_0; X_1; ..; X_{t-1}] (N/t rows each). A GEMM's output row n
// depends only on input row n, so Y = [X_0 W_i^T; ..; X_{t-1} W_i^T]: the GEMM runs as t GEMMs of
// N/t rows, the one on X_k as soon as X_k is here. Every output element is the same sum over K in
// the same order as in the one big GEMM; only the row count of each call changes. Likewise after
// a row-parallel GEMM the reduce-scatter gives rank k the sum over ranks of rows k of the
// partial products P = Z W_i^T; rows k are a GEMM of their own (Z's rows k), so each rank
// computes the rows another rank owns first, sends them while it computes the next, and computes
// its own last. The sum itself adds the t pieces in rank order 0, 1, .., t-1, the order the
// reductions add them in (the emulated NCCL's, and any order for t = 2: a + b = b + a exactly).
// The backward is the same two patterns in reverse:
//   column forward   (f, all-gather X)      GEMM chunk k of Y when X_k arrives
//   row forward      (g, reduce-scatter P)  GEMM the rows owner d needs, send them, next owner
//   row backward     (g', all-gather dY)    dX chunk k = dY_k W_i when dY_k arrives; then dW, db
//                                           over all N rows at once (a sum over rows: cut into
//                                           chunks it would add in another order)
//   column backward  (f', reduce-scatter dX; the input re-gathered for dW)
//                                           the gather of X for dW starts first; dX's rows by
//                                           owner, each sent as it is written; dW once X is
//                                           here; the sum of dX's pieces last
//
// Who talks to whom, per chunked collective (rank r of the tp group of t, all inside one node):
//   all-gather      a ring: at step j = 1 .. t-1, r sends chunk (r - j + 1) mod t to r + 1 and
//                   receives chunk (r - j) mod t from r - 1 (step 1 sends its own slice).
//   reduce-scatter  direct: at step j = 0 .. t-2, r sends the rows of owner d = (r + j + 1) mod t
//                   to d and receives its own rows' piece from (r - j - 1) mod t.
// Each step is one p2p_batch (parallel/comm.h) on the ring stream; events order the two streams:
//   ready        compute -> ring: the slice to send and every earlier reader of the buffers
//   gathered[j]  ring -> compute: all-gather step j's chunk has arrived
//   computed[j]  compute -> ring: the rows reduce-scatter step j sends are written
//   reduced[j]   ring -> compute: reduce-scatter step j's piece has arrived
// A function returns only after its compute stream has waited for every piece, so the tp
// group's other collectives (the embedding's, the loss's, on the compute stream; the partial
// gradients' sum, on the communication stream) never run beside these on one communicator.
//
// Bytes: unchanged. Per rank and chunked collective, t - 1 messages of N/t rows each way:
// (t - 1)/t * N * width * b sent, what the ring all-gather or reduce-scatter puts on the wire;
// the counters (parallel/comm.h) record them as sends and receives instead of one collective, and
// the planner's wire bytes (training/plan.cu) come out the same. No new buffers: the gathered
// rows land where the plain all-gather puts them, and a reduce-scatter's incoming pieces land in
// rows of the partial-product buffer that were already sent (and the first in the output, whose
// rows are written last).
//
// Timeline, t = 4, rank 0; one block's attention half forward (the MLP's is the same):
//
//   ring     |s0 r3|s3 r2|s2 r1|          |s1 r3 |s2 r2 |s3 r1 |
//   compute  |Y0 ..|Y3 ..|Y2 ..|Y1|attn...|P1|P2   |P3    |P0|  |sum|+b,x|LN2
//             qkv GEMM, chunk by chunk     proj GEMM by owner    wait, add in rank order
//
// (All-gather steps: sK rL = send chunk K, receive chunk L; reduce-scatter steps: sD rF = send
// owner D's rows, receive rank F's piece of ours. Yk: the column GEMM's rows of chunk k; Pd: the
// row GEMM's rows owner d gets.) Without overlap the compute stream would stop for each whole
// collective: |AG|qkv|attn|proj|RS|+b,x|. The ring stream is the one the data-parallel bucket
// reductions use (the model's communication stream, as ring attention's): a chunk queued behind
// a bucket's all-reduce waits for it. A stream of its own would let the chunks pass; not done. On a GPU the chunk GEMMs of N/t rows may be picked a
// different cuBLASLt algorithm than the one of N rows (rounding within the GEMM's own error).
// On the CPU backend and the emulated CUDA tier the results at tp = 2 are bitwise those of
// tp_overlap = false (test/test_tensor_parallel.py, test/test_gpu_train.py); at tp > 2 too on
// the emulated tier in fp32 (its NCCL adds in rank order), not in bf16 (each add here rounds to
// bf16, the reduction rounds its fp32 sum once) nor over MPI (whose reduce-scatter adds in an
// order of its own): rounding-level differences, within test_tensor_parallel's tolerances.
#include <utility>
#include <vector>

#include "parallel/tensor_parallel.h"

namespace {

int wrap(int a, int t) { return ((a % t) + t) % t; }

// Rows [first, first + n) of a row-major matrix `width` wide, of dtype dt (null stays null: the
// planner's dry step has no buffers).
void* rows_at(const void* base, size_t first, int width, DType dt) {
  if (!base) return nullptr;
  return (char*)base + first * width * dtype_size(dt);
}

// The all-gather as a ring on the ring stream: `all` (t x rows x width) gets every rank's `mine`
// (rows x width) in rank order. Chunk (r - j) mod t arrives at step j (gathered[j - 1]); this
// rank's own rows are copied on s. The compute stream waits per chunk (wait_gathered).
void ring_gather(const TensorParallel& tp, void* all, const void* mine, int rows, int width,
                 DType dt, ops::Stream s) {
  TpOverlap& o = *tp.chunks;
  const int t = tp.size(), r = tp.rank();
  const size_t count = (size_t)rows * width;
  ops::event_record(o.ready, s);
  ops::stream_wait_event(o.ring, o.ready);
  for (int j = 1; j < t; j++) {
    const int send = wrap(r - j + 1, t), recv = wrap(r - j, t);
    P2POp step[2];
    step[0].is_send = true;
    step[0].buf = j == 1 ? (void*)mine : rows_at(all, (size_t)send * rows, width, dt);
    step[0].count = count, step[0].peer = wrap(r + 1, t);
    step[1].buf = rows_at(all, (size_t)recv * rows, width, dt);
    step[1].count = count, step[1].peer = wrap(r - 1, t);
    p2p_batch(*tp.group, step, 2, dt, o.ring);
    ops::event_record(o.gathered[j - 1], o.ring);
  }
  ops::copy_on_device(rows_at(all, (size_t)r * rows, width, dt), mine,
                      count * dtype_size(dt), s);
}

// The chunk that arrives at all-gather step j (0: this rank's own), and the wait for it.
int gathered_chunk(const TensorParallel& tp, int j) { return wrap(tp.rank() - j, tp.size()); }
void wait_gathered(const TensorParallel& tp, int j, ops::Stream s) {
  if (j > 0) ops::stream_wait_event(s, tp.chunks->gathered[j - 1]);
}

// The reduce-scatter by owner, first half. rows_for(d, dst) writes owner d's rows (rows x width)
// of this rank's partial result into dst on s. Owners d_j = (r + j + 1) mod t for j = 0 .. t-2
// get their rows in `scratch` (t x rows x width), each sent as soon as it is written, while the
// piece of this rank's rows from (r - j - 1) mod t comes in: step 0's into `mine` (rows x width),
// step j's into the scratch rows step j - 1 sent. This rank's own rows are written last (scratch
// rows r). Returns where each rank's piece of this rank's rows is (or will be).
template <typename RowsFor>
std::vector<const void*> send_by_owner(const TensorParallel& tp, RowsFor rows_for, void* scratch,
                                       void* mine, int rows, int width, DType dt, ops::Stream s) {
  TpOverlap& o = *tp.chunks;
  const int t = tp.size(), r = tp.rank();
  std::vector<const void*> piece(t);
  for (int j = 0; j + 1 < t; j++) {
    const int owner = wrap(r + j + 1, t), from = wrap(r - j - 1, t);
    void* out = rows_at(scratch, (size_t)owner * rows, width, dt);
    void* in = j == 0 ? mine : rows_at(scratch, (size_t)wrap(r + j, t) * rows, width, dt);
    rows_for(owner, out);
    ops::event_record(o.computed[j], s);
    ops::stream_wait_event(o.ring, o.computed[j]);
    P2POp step[2];
    step[0].is_send = true, step[0].buf = out, step[0].count = (size_t)rows * width;
    step[0].peer = owner;
    step[1].buf = in, step[1].count = (size_t)rows * width, step[1].peer = from;
    p2p_batch(*tp.group, step, 2, dt, o.ring);
    ops::event_record(o.reduced[j], o.ring);
    piece[from] = in;
  }
  void* own = rows_at(scratch, (size_t)r * rows, width, dt);
  rows_for(r, own);
  piece[r] = own;
  return piece;
}

// The second half: once every piece is here, mine = piece 0 + piece 1 + ... in rank order (the
// reductions' order). Two values add the same either way round, so the one that is also the
// output goes first (add_bias_residual: out may be inp). Returns mine.
void* sum_in_rank_order(const TensorParallel& tp, const std::vector<const void*>& piece,
                        void* mine, int rows, int width, DType dt, ops::Stream s) {
  const int t = tp.size();
  for (int j = 0; j + 1 < t; j++) ops::stream_wait_event(s, tp.chunks->reduced[j]);
  const void* acc = piece[0];
  for (int q = 1; q < t; q++) {
    void* out = q == t - 1 ? mine : (void*)piece[0];
    const void* a = acc;
    const void* b = piece[q];
    if (out == b) std::swap(a, b);
    ops::add_bias_residual(out, a, nullptr, b, rows, width, dt, s);
    acc = out;
  }
  return mine;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Set-up
// ---------------------------------------------------------------------------------------------
void tp_overlap_create(TensorParallel& tp, Allocator& memory, ops::Stream ring) {
  if (!tp.overlap || !tp.sp || !tp.active() || !ring) return;  // (no ring: a bare test model)
  TpOverlap* o = new TpOverlap;
  o->ring = ring;
  o->ready = allocate_event(memory);
  for (int j = 0; j + 1 < tp.size(); j++) {
    o->gathered.push_back(allocate_event(memory));
    o->computed.push_back(allocate_event(memory));
    o->reduced.push_back(allocate_event(memory));
  }
  tp.chunks = o;
}

void tp_overlap_destroy(TensorParallel& tp) {
  delete tp.chunks;
  tp.chunks = nullptr;
}

bool tp_overlapped(const TensorParallel& tp) { return tp.chunks && tp.sp && tp.active(); }

// ---------------------------------------------------------------------------------------------
// The four linears
// ---------------------------------------------------------------------------------------------
const void* overlap_column_forward(const TensorParallel& tp, const LinearGemm& gemm,
                                   const TpBuffers& buf, void* out, void* pre_gelu,
                                   const void* inp_mine, const void* weight, const void* bias,
                                   int N, int K, int OC, ops::Stream s) {
  const int Nt = tp.tokens(N);
  const DType dt = gemm.dt;
  ring_gather(tp, buf.gathered, inp_mine, Nt, K, dt, s);
  for (int j = 0; j < tp.size(); j++) {
    const size_t first = (size_t)gathered_chunk(tp, j) * Nt;
    wait_gathered(tp, j, s);
    gemm.forward(gemm, rows_at(out, first, OC, dt), rows_at(pre_gelu, first, OC, dt),
                 j == 0 ? inp_mine : rows_at(buf.gathered, first, K, dt), weight, bias, nullptr,
                 Nt, K, OC, s);
  }
  return buf.gathered;
}

void overlap_row_forward(const TensorParallel& tp, const LinearGemm& gemm, const TpBuffers& buf,
                         void* out, const void* inp, const void* weight, const void* bias,
                         const void* residual, int N, int K, int OC, ops::Stream s) {
  const int Nt = tp.tokens(N);
  const DType dt = gemm.dt;
  auto rows_for = [&](int owner, void* dst) {
    gemm.forward(gemm, dst, nullptr, rows_at(inp, (size_t)owner * Nt, K, dt), weight, nullptr,
                 nullptr, Nt, K, OC, s);
  };
  const std::vector<const void*> piece =  // g forward
      send_by_owner(tp, rows_for, buf.partial, out, Nt, OC, dt, s);
  sum_in_rank_order(tp, piece, out, Nt, OC, dt, s);
  ops::add_bias_residual(out, out, bias, residual, Nt, OC, dt, s);
}

void overlap_row_backward(const TensorParallel& tp, const LinearGemm& gemm, const TpBuffers& buf,
                          void* dinp, float* dweight, float* dbias, const void* dout_mine,
                          const void* inp, const void* weight, const void* gelu_input, int N,
                          int K, int OC, ops::Stream s, GradPart part) {
  const int Nt = tp.tokens(N);
  const DType dt = gemm.dt;
  ring_gather(tp, buf.gathered, dout_mine, Nt, OC, dt, s);  // g backward
  for (int j = 0; j < tp.size(); j++) {
    const size_t first = (size_t)gathered_chunk(tp, j) * Nt;
    wait_gathered(tp, j, s);
    gemm.backward(gemm, rows_at(dinp, first, K, dt), nullptr, nullptr,
                  j == 0 ? dout_mine : rows_at(buf.gathered, first, OC, dt), nullptr, weight,
                  rows_at(gelu_input, first, K, dt), Nt, K, OC, s, GradPart::Input);
  }
  if (part == GradPart::Both)  // over every token at once: the sum over rows keeps its order
    gemm.backward(gemm, nullptr, dweight, dbias, buf.gathered, inp, nullptr, nullptr, N, K, OC,
                  s, GradPart::Weight);
}

const void* overlap_column_backward(const TensorParallel& tp, const LinearGemm& gemm,
                                    const TpBuffers& buf, float* dweight, float* dbias,
                                    const void* dout, const void* inp_mine, bool gathered_kept,
                                    const void* weight, int N, int K, int OC, ops::Stream s,
                                    GradPart part) {
  const int Nt = tp.tokens(N);
  const DType dt = gemm.dt;
  const bool weight_grad = part == GradPart::Both;
  // The input for dW travels first, while dX's first rows are computed.
  if (weight_grad && !gathered_kept) ring_gather(tp, buf.gathered, inp_mine, Nt, K, dt, s);
  auto rows_for = [&](int owner, void* dst) {
    gemm.backward(gemm, dst, nullptr, nullptr, rows_at(dout, (size_t)owner * Nt, OC, dt), nullptr,
                  weight, nullptr, Nt, K, OC, s, GradPart::Input);
  };
  // dX's rows by owner, each sent as it is written; then dW while the last pieces travel; then
  // the sum over the ranks (f backward).
  const std::vector<const void*> piece =
      send_by_owner(tp, rows_for, buf.dinp_all, buf.dinp, Nt, K, dt, s);
  if (weight_grad) {
    if (!gathered_kept)
      for (int j = 1; j < tp.size(); j++) wait_gathered(tp, j, s);
    gemm.backward(gemm, nullptr, dweight, dbias, dout, buf.gathered, nullptr, nullptr, N, K, OC,
                  s, GradPart::Weight);
  }
  return sum_in_rank_order(tp, piece, buf.dinp, Nt, K, dt, s);
}
