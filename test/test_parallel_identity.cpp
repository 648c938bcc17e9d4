// test/test_parallel_identity.cpp - the parallel layers at size 1 are the one-rank computation,
// bit for bit, and hold nothing extra: what lets the model call them without branching on an
// axis (model/gpt.cu, model/moe.cu). One process, CPU backend, fresh random inputs of awkward
// sizes (the seed is printed; SEED=<n> reproduces it).
//
//  TP, tp = 1 (parallel/tensor_parallel.h): column_parallel_forward / backward and
//    row_parallel_forward / backward with compute_dtype_gemm write bitwise what
//    ops::matmul_forward / backward write when called directly on the same inputs, in fp32 and
//    bf16, with and without GELU, bias and residual; the column forward hands back its own input
//    (nothing gathered) and the column backward the dX buffer (nothing summed).
//  CP, cp = 1 (parallel/context_parallel.h): cp_create counts 0 bytes and allocates nothing
//    (ops::memory_in_use unchanged); cp_attention_forward / backward write bitwise what
//    ops::attention_forward / backward write.
//  EP, ep = 1 (parallel/expert_parallel.h): trip_rows is 0; ep_trip_buffer picks the other
//    side's buffer; a route holds all N*top_k pairs; ep_to_experts and ep_to_home in place leave
//    the rows untouched, and between two buffers copy them exactly.
//  tp_sum_partial_grads over a counting group of 2 ranks (CommBackend::Count: nothing moves,
//    every call is counted): exactly one all-reduce of 4 bytes times the brute-force count of the
//    shard's elements in [partial_begin, numel), or no call when there are none; 2000 random
//    (shard, partial_begin, numel) cases plus the edges.
// Prints one line per check; exits 1 on any failure.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "parallel/context_parallel.h"
#include "parallel/expert_parallel.h"
#include "parallel/tensor_parallel.h"
#include "test/check_results.h"

namespace {

Results results;
std::mt19937 rng;
ops::Stream stream = nullptr;

// A device buffer of n elements of dt holding uniform random values in [-1, 1).
void* random_buffer(size_t n, DType dt) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> host(n);
  for (float& x : host) x = u(rng);
  float* f32 = (float*)ops::alloc(n * 4);
  ops::copy_to_device(f32, host.data(), n * 4);
  void* out = ops::alloc(n * dtype_size(dt));
  ops::cast(out, dt, f32, DType::F32, n, stream);
  ops::stream_sync(stream);
  ops::release(f32);
  return out;
}

// A copy of a device buffer (bytes), so that two computations start from the same values.
void* clone(const void* src, size_t bytes) {
  void* p = ops::alloc(bytes);
  ops::copy_on_device(p, src, bytes, stream);
  return p;
}

bool same_bytes(const void* a, const void* b, size_t bytes) {
  std::vector<unsigned char> x(bytes), y(bytes);
  ops::stream_sync(stream);
  ops::copy_to_host(x.data(), a, bytes);
  ops::copy_to_host(y.data(), b, bytes);
  return std::memcmp(x.data(), y.data(), bytes) == 0;
}

// A one-rank group of `axis` (what the mesh makes for a degree of 1).
Comm one_rank(Axis axis) {
  Comm c;
  c.axis = axis;
  return c;
}

// ---------------------------------------------------------------------------------------------
// Tensor parallel, tp = 1
// ---------------------------------------------------------------------------------------------
void check_tp_linears(DType dt, int N, int K, int OC) {
  Comm group = one_rank(Axis::TP);
  const TensorParallel tp{&group, true};
  const LinearGemm gemm = compute_dtype_gemm(dt);
  const size_t e = dtype_size(dt);
  void* inp = random_buffer((size_t)N * K, dt);
  void* weight = random_buffer((size_t)OC * K, dt);
  void* bias = random_buffer(OC, dt);
  void* residual = random_buffer((size_t)N * OC, dt);
  void* dout = random_buffer((size_t)N * OC, dt);
  void* pre = random_buffer((size_t)N * K, dt);  // a GELU input for the row backward
  const char* name = dtype_name(dt);

  // column-parallel forward with GELU: out, pre_gelu
  void *out = ops::alloc((size_t)N * OC * e), *out_ref = ops::alloc((size_t)N * OC * e);
  void *pg = ops::alloc((size_t)N * OC * e), *pg_ref = ops::alloc((size_t)N * OC * e);
  TpBuffers buf;
  const void* used = column_parallel_forward(tp, gemm, buf, out, pg, inp, weight, bias, N, K, OC,
                                             stream);
  ops::matmul_forward(out_ref, pg_ref, inp, weight, bias, nullptr, N, K, OC, dt, stream);
  results.check(used == inp && same_bytes(out, out_ref, (size_t)N * OC * e) &&
                    same_bytes(pg, pg_ref, (size_t)N * OC * e),
                "%s column_parallel_forward (gelu, bias) %dx%d->%d: the GEMM's output bitwise, "
                "its own input used", name, N, K, OC);

  // row-parallel forward: bias and residual in the epilogue
  row_parallel_forward(tp, gemm, buf, out, inp, weight, bias, residual, N, K, OC, stream);
  ops::matmul_forward(out_ref, nullptr, inp, weight, bias, residual, N, K, OC, dt, stream);
  results.check(same_bytes(out, out_ref, (size_t)N * OC * e),
                "%s row_parallel_forward (bias, residual) %dx%d->%d: bitwise", name, N, K, OC);

  // column-parallel backward: dX into buf.dinp_all (= buf.dinp at tp = 1), dW and db accumulate
  const size_t wbytes = (size_t)OC * K * 4;
  float* dw = (float*)random_buffer((size_t)OC * K, DType::F32);
  float* db = (float*)random_buffer(OC, DType::F32);
  float* dw_ref = (float*)clone(dw, wbytes);
  float* db_ref = (float*)clone(db, (size_t)OC * 4);
  void *dinp = ops::alloc((size_t)N * K * e), *dinp_ref = ops::alloc((size_t)N * K * e);
  buf.dinp_all = buf.dinp = dinp;
  const void* dx = column_parallel_backward(tp, gemm, buf, dw, db, dout, inp, false, weight, N,
                                            K, OC, stream);
  ops::matmul_backward(dinp_ref, dw_ref, db_ref, dout, inp, weight, nullptr, N, K, OC, dt,
                       stream);
  results.check(dx == dinp && same_bytes(dinp, dinp_ref, (size_t)N * K * e) &&
                    same_bytes(dw, dw_ref, wbytes) && same_bytes(db, db_ref, (size_t)OC * 4),
                "%s column_parallel_backward: dX, dW, db bitwise, dX in the given buffer", name);

  // row-parallel backward with a GELU input
  row_parallel_backward(tp, gemm, buf, dinp, dw, db, dout, inp, weight, pre, N, K, OC, stream);
  ops::matmul_backward(dinp_ref, dw_ref, db_ref, dout, inp, weight, pre, N, K, OC, dt, stream);
  results.check(same_bytes(dinp, dinp_ref, (size_t)N * K * e) && same_bytes(dw, dw_ref, wbytes) &&
                    same_bytes(db, db_ref, (size_t)OC * 4),
                "%s row_parallel_backward (gelu input): dX, dW, db bitwise", name);
  for (void* p : {inp, weight, bias, residual, dout, pre, out, out_ref, pg, pg_ref, (void*)dw,
                  (void*)db, (void*)dw_ref, (void*)db_ref, dinp, dinp_ref})
    ops::release(p);
}

// ---------------------------------------------------------------------------------------------
// Context parallel, cp = 1
// ---------------------------------------------------------------------------------------------
void check_cp_attention(DType dt, int B, int T, int NH, int HS) {
  Comm group = one_rank(Axis::CP);
  const size_t before = ops::memory_in_use();
  ContextParallel cp;
  Allocator memory;
  cp_create(cp, &group, B, T, NH, NH, HS, dt, memory, nullptr);
  results.check(memory.bytes == 0 && ops::memory_in_use() == before && !cp.kv[0] && !cp.dq &&
                    !cp.ready,
                "%s cp_create with one rank: 0 bytes counted, nothing allocated", dtype_name(dt));
  const size_t C = (size_t)NH * HS, e = dtype_size(dt), rows = (size_t)B * T;
  void* qkv = random_buffer(rows * 3 * C, dt);
  void* dout = random_buffer(rows * C, dt);
  void *out = ops::alloc(rows * C * e), *out_ref = ops::alloc(rows * C * e);
  float *lse = (float*)ops::alloc(rows * NH * 4), *lse_ref = (float*)ops::alloc(rows * NH * 4);
  cp_attention_forward(cp, out, lse, qkv, B, T, stream);
  ops::attention_forward(out_ref, lse_ref, qkv, B, T, NH, NH, HS, dt, stream);
  results.check(same_bytes(out, out_ref, rows * C * e) && same_bytes(lse, lse_ref, rows * NH * 4),
                "%s cp_attention_forward B=%d T=%d NH=%d HS=%d: out and lse bitwise",
                dtype_name(dt), B, T, NH, HS);
  void *dqkv = ops::alloc(rows * 3 * C * e), *dqkv_ref = ops::alloc(rows * 3 * C * e);
  cp_attention_backward(cp, dqkv, dout, qkv, out, lse, B, T, stream);
  ops::attention_backward(dqkv_ref, dout, qkv, out, lse, B, T, NH, NH, HS, dt, stream);
  results.check(same_bytes(dqkv, dqkv_ref, rows * 3 * C * e),
                "%s cp_attention_backward: dqkv bitwise", dtype_name(dt));
  allocator_free(memory);
  for (void* p : {qkv, dout, out, out_ref, (void*)lse, (void*)lse_ref, dqkv, dqkv_ref})
    ops::release(p);
}

// ---------------------------------------------------------------------------------------------
// Expert parallel, ep = 1
// ---------------------------------------------------------------------------------------------
void check_ep_trips(int N, int E, int top_k, int C) {
  Comm group = one_rank(Axis::EP);
  ExpertParallel ep{&group, E, top_k};
  int marker_a = 0, marker_b = 0;
  results.check(ep.trip_rows(N) == 0 && ep_trip_buffer(ep, &marker_a, &marker_b) == &marker_b,
                "ep = 1: no trip scratch (trip_rows %d), ep_trip_buffer picks the other side",
                ep.trip_rows(N));
  std::vector<int> expert, all(E);
  for (int n = 0; n < N; n++) {  // top_k distinct experts per token, as the router picks them
    for (int e = 0; e < E; e++) all[e] = e;
    std::shuffle(all.begin(), all.end(), rng);
    expert.insert(expert.end(), all.begin(), all.begin() + top_k);
  }
  Allocator memory;
  ExpertRoute r;
  ep_route_create(r, ep, N, memory);
  ep_route(r, ep, expert.data(), N, stream);
  results.check(r.M == N * top_k && !r.regroup && !r.ungroup,
                "ep = 1 route: all %d pairs stay (M = %d), no regroup arrays", N * top_k, r.M);
  const size_t rows_bytes = (size_t)r.M * C * 4;
  void* rows = random_buffer((size_t)r.M * C, DType::F32);
  void* saved = clone(rows, rows_bytes);
  void* other = ops::alloc(rows_bytes);
  ep_to_experts(ep, r, rows, rows, nullptr, C, DType::F32, stream);
  ep_to_home(ep, r, rows, rows, nullptr, C, DType::F32, stream);
  results.check(same_bytes(rows, saved, rows_bytes),
                "ep = 1 trips in place (N=%d E=%d top_k=%d C=%d): the rows untouched", N, E, top_k,
                C);
  ep_to_experts(ep, r, rows, other, nullptr, C, DType::F32, stream);
  const bool to_experts = same_bytes(other, saved, rows_bytes);
  ops::fill_zero(rows, rows_bytes, stream);
  ep_to_home(ep, r, other, rows, nullptr, C, DType::F32, stream);
  results.check(to_experts && same_bytes(rows, saved, rows_bytes),
                "ep = 1 trips between two buffers: an exact copy each way");
  allocator_free(memory);
  for (void* p : {rows, saved, other}) ops::release(p);
}

// ---------------------------------------------------------------------------------------------
// The partial gradients' sum: which elements go over the wire
// ---------------------------------------------------------------------------------------------
// Calls and bytes of all-reduce counted on `stats` by one tp_sum_partial_grads call.
void partial_sum_counts(FlatRange shard, size_t partial_begin, size_t numel, uint64_t* calls,
                        uint64_t* bytes) {
  CommStats stats{};
  Comm group = one_rank(Axis::TP);
  group.size = 2, group.rank = 1, group.backend = CommBackend::Count, group.stats = &stats;
  std::vector<float> grad(shard.size() + 1);
  tp_sum_partial_grads(group, grad.data(), shard, partial_begin, numel, stream);
  const CommCounters& k = stats.axis[(int)Axis::TP];
  *calls = k.calls[(int)CollectiveKind::AllReduce];
  *bytes = k.bytes[(int)CollectiveKind::AllReduce];
}

void check_partial_grad_ranges() {
  struct Case { size_t first, end, partial_begin, numel; };
  std::vector<Case> cases = {{0, 100, 100, 100},  {0, 100, 0, 100},  {0, 64, 40, 100},
                             {64, 128, 40, 100}, {128, 192, 40, 100}, {0, 0, 0, 10}};
  std::uniform_int_distribution<int> u(0, 300);
  for (int i = 0; i < 2000; i++) {
    const size_t numel = u(rng), partial = u(rng) % (numel + 1), first = u(rng);
    cases.push_back({first, first + u(rng) % 100, partial, numel});
  }
  int wrong = 0;
  for (const Case& c : cases) {
    size_t want = 0;  // brute force: the shard's elements that are partial
    for (size_t i = c.first; i < c.end; i++) want += i >= c.partial_begin && i < c.numel;
    uint64_t calls = 0, bytes = 0;
    partial_sum_counts({c.first, c.end}, c.partial_begin, c.numel, &calls, &bytes);
    const bool ok = calls == (want > 0 ? 1u : 0u) && bytes == 4 * want;
    if (!ok && wrong++ < 3)
      std::printf("  shard [%zu,%zu) partial [%zu,%zu): %llu calls %llu bytes, want %zu floats\n",
                  c.first, c.end, c.partial_begin, c.numel, (unsigned long long)calls,
                  (unsigned long long)bytes, want);
  }
  results.check(wrong == 0,
                "tp_sum_partial_grads: one all-reduce of exactly the shard's partial elements "
                "(none when there are none), %zu cases, %d wrong", cases.size(), wrong);
}

}  // namespace

int main() {
  const unsigned seed = std::getenv("SEED") ? (unsigned)std::atoll(std::getenv("SEED"))
                                            : std::random_device{}();
  std::printf("test_parallel_identity: seed %u (SEED=%u reproduces)\n", seed, seed);
  rng.seed(seed);
  stream = ops::stream_create(StreamOptions{});
  check_tp_linears(DType::F32, 37, 23, 29);
  check_tp_linears(DType::BF16, 19, 40, 13);
  check_cp_attention(DType::F32, 3, 13, 3, 8);
  check_cp_attention(DType::BF16, 2, 21, 2, 16);
  check_ep_trips(37, 5, 2, 11);
  check_ep_trips(13, 3, 3, 7);
  check_partial_grad_ranges();
  ops::stream_destroy(stream);
  std::printf("test_parallel_identity: %d checks, %d failed\n", results.checks, results.failures);
  return results.exit_status();
}
