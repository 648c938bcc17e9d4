// test/test_ring_gqa.cpp - ring attention (parallel/context_parallel.cu) with grouped-query
// attention, over cp = the world size (mpirun -np 2 or 3), on the CPU backend and MPI.
//
// Every rank makes the same random packed qkv (B, T, (NH + 2 NKV) HS) = [q heads | k heads |
// v heads] and dout (B, T, NH HS) from one seed (argv[1]), runs the one-rank ops::attention_forward
// / backward over the whole sequences (the reference: the CPU op, which test_ops.py checks against
// float64), then cp_attention_forward / backward on its own zigzag chunks (cp_select_tokens'
// rows), and compares at its global positions:
//   out, lse, dq, dk, dv: relative L2 error <= 1e-5 in fp32 (the ring
//   merges blocks in another order than the one-rank rows: rounding only; measured <= 2e-7).
// The ring's traffic on the cp axis is counted exactly: Send bytes = cp_bytes(cp, B, T, NKV*HS,
// 4, 4) forward + backward, i.e. only the NKV kv heads travel (a ring that moved NH heads would
// send NH/NKV times as much and fail). Shapes: NH/NKV = 4/2, 6/1 (and 3/3, plain multi-head, as
// GPT-2 runs it), HS 7, T = 2 cp c with chunks of 3 and 5 positions, B = 2.
//
//   mpirun -np 2 build/test_ring_gqa [seed]   (test/run_all.sh's group ring-gqa: 2 and 3 ranks)
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "parallel/context_parallel.h"
#include "parallel/mesh.h"
#include "test/check_results.h"

namespace {

struct Shape {
  int B, T, NH, NKV, HS;
  int width() const { return (NH + 2 * NKV) * HS; }
  int C() const { return NH * HS; }
};

std::vector<float> random_floats(std::mt19937& gen, size_t n) {
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> v(n);
  for (float& x : v) x = normal(gen);
  return v;
}

void* upload(const std::vector<float>& v) {
  void* p = ops::alloc(v.size() * sizeof(float));
  ops::copy_to_device(p, v.data(), v.size() * sizeof(float));
  return p;
}
std::vector<float> download(const void* p, size_t n) {
  std::vector<float> v(n);
  ops::copy_to_host(v.data(), p, n * sizeof(float));
  return v;
}

// Rows (B*T, width) of the full batch -> this rank's local rows (chunk-major), and the same for
// (B, NH, T) lse -> (2, B, NH, Tc).
std::vector<float> local_rows(const std::vector<float>& full, const TokenPositions& p, int T,
                              int width) {
  std::vector<float> r;
  for (int k = 0; k < p.chunks; k++)
    for (int b = 0; b < p.B; b++)
      for (int t = 0; t < p.len; t++) {
        const float* row = &full[((size_t)b * T + p.first[k] + t) * width];
        r.insert(r.end(), row, row + width);
      }
  return r;
}
std::vector<float> local_lse(const std::vector<float>& full, const TokenPositions& p, int T,
                             int NH) {
  std::vector<float> r;
  for (int k = 0; k < p.chunks; k++)
    for (int b = 0; b < p.B; b++)
      for (int h = 0; h < NH; h++)
        for (int t = 0; t < p.len; t++)
          r.push_back(full[((size_t)b * NH + h) * T + p.first[k] + t]);
  return r;
}

// Columns [col0, col0 + n) of every row of (rows, width).
std::vector<float> columns(const std::vector<float>& x, int width, int col0, int n) {
  std::vector<float> r;
  for (size_t i = 0; i < x.size() / width; i++)
    r.insert(r.end(), x.begin() + i * width + col0, x.begin() + i * width + col0 + n);
  return r;
}

double rel_err(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); i++) {
    num += ((double)got[i] - want[i]) * ((double)got[i] - want[i]);
    den += (double)want[i] * want[i];
  }
  return std::sqrt(num / (den > 0 ? den : 1));
}

Results results;

void check_shape(Mesh& mesh, const Shape& sh, unsigned seed) {
  Comm& group = mesh[Axis::CP];
  const int cp = group.size, rows = sh.B * sh.T, width = sh.width(), C = sh.C();
  std::mt19937 gen(seed);
  const std::vector<float> qkv = random_floats(gen, (size_t)rows * width);
  const std::vector<float> dout = random_floats(gen, (size_t)rows * C);
  ops::Stream s = ops::stream_create(StreamOptions{}), ring = ops::stream_create(StreamOptions{});

  // The reference: one rank, every position.
  void* d_qkv = upload(qkv);
  void* d_dout = upload(dout);
  void* d_out = ops::alloc((size_t)rows * C * 4);
  void* d_lse = ops::alloc((size_t)sh.B * sh.NH * sh.T * 4);
  void* d_dqkv = ops::alloc((size_t)rows * width * 4);
  ops::attention_forward(d_out, (float*)d_lse, d_qkv, sh.B, sh.T, sh.NH, sh.NKV, sh.HS,
                         DType::F32, s);
  ops::attention_backward(d_dqkv, d_dout, d_qkv, d_out, (const float*)d_lse, sh.B, sh.T, sh.NH,
                          sh.NKV, sh.HS, DType::F32, s);
  ops::stream_sync(s);
  const TokenPositions pos = cp_positions_of(cp, group.rank, sh.B, sh.T);
  const std::vector<float> want_out = local_rows(download(d_out, (size_t)rows * C), pos, sh.T, C);
  const std::vector<float> want_lse =
      local_lse(download(d_lse, (size_t)sh.B * sh.NH * sh.T), pos, sh.T, sh.NH);
  const std::vector<float> want_dqkv =
      local_rows(download(d_dqkv, (size_t)rows * width), pos, sh.T, width);

  // The ring over the cp group, on this rank's chunks.
  ContextParallel ctx;
  Allocator memory;
  cp_create(ctx, &group, sh.B, sh.T, sh.NH, sh.NKV, sh.HS, DType::F32, memory, ring);
  const int T_local = 2 * pos.len, local = sh.B * T_local;
  void* l_qkv = upload(local_rows(qkv, pos, sh.T, width));
  void* l_dout = upload(local_rows(dout, pos, sh.T, C));
  void* l_out = ops::alloc((size_t)local * C * 4);
  void* l_lse = ops::alloc((size_t)local * sh.NH * 4);
  void* l_dqkv = ops::alloc((size_t)local * width * 4);
  comm_stats_reset(*group.stats);
  cp_attention_forward(ctx, l_out, (float*)l_lse, l_qkv, sh.B, T_local, s);
  cp_attention_backward(ctx, l_dqkv, l_dout, l_qkv, l_out, (const float*)l_lse, sh.B, T_local, s);
  ops::stream_sync(s);
  ops::stream_sync(ring);

  const std::vector<float> out = download(l_out, (size_t)local * C);
  const std::vector<float> lse = download(l_lse, (size_t)local * sh.NH);
  const std::vector<float> dqkv = download(l_dqkv, (size_t)local * width);
  const int Ckv = sh.NKV * sh.HS;
  const double errs[5] = {
      rel_err(out, want_out), rel_err(lse, want_lse),
      rel_err(columns(dqkv, width, 0, C), columns(want_dqkv, width, 0, C)),
      rel_err(columns(dqkv, width, C, Ckv), columns(want_dqkv, width, C, Ckv)),
      rel_err(columns(dqkv, width, C + Ckv, Ckv), columns(want_dqkv, width, C + Ckv, Ckv))};
  bool close = true;  // NaN fails
  for (double e : errs) close = close && e <= 1e-5;
  results.check(close,
                "rank %d cp=%d B=%d T=%d NH=%d NKV=%d HS=%d: ring == one rank: out %.1e, lse "
                "%.1e, dq %.1e, dk %.1e, dv %.1e (tol 1e-5)",
                group.rank, cp, sh.B, sh.T, sh.NH, sh.NKV, sh.HS, errs[0], errs[1], errs[2],
                errs[3], errs[4]);
  const CpBytes want = cp_bytes(cp, sh.B, sh.T, Ckv, 4, 4);
  const CommCounters& n = group.stats->axis[(int)Axis::CP];
  const uint64_t sent = n.bytes[(int)CollectiveKind::Send];
  results.check(sent == want.forward + want.backward,
                "rank %d cp=%d NH=%d NKV=%d: the ring sent %llu bytes, cp_bytes of the %d kv "
                "heads says %zu (multi-head would be %zu)",
                group.rank, cp, sh.NH, sh.NKV, (unsigned long long)sent, sh.NKV,
                want.forward + want.backward,
                (want.forward + want.backward) / sh.NKV * sh.NH);

  allocator_free(memory);
  for (void* p : {d_qkv, d_dout, d_out, d_lse, d_dqkv, l_qkv, l_dout, l_out, l_lse, l_dqkv})
    ops::release(p);
  ops::stream_destroy(s);
  ops::stream_destroy(ring);
}

}  // namespace

int main(int argc, char** argv) {
  int world_rank = 0, world_size = 1, local_rank = 0;
  runtime_init(&argc, &argv, &world_rank, &world_size, &local_rank);
  const unsigned seed = argc > 1 ? (unsigned)std::strtoul(argv[1], nullptr, 10) : 1234u;
  Config cfg;
  cfg.parallel.cp = world_size;
  cfg.model.n_head = 6, cfg.model.seq_len = 2 * world_size * 5, cfg.model.n_layer = 1;
  Mesh mesh;
  mesh_init(mesh, mesh_shape(cfg), world_rank, local_rank, CommBackend::MPI);
  const int cp = world_size;
  const Shape shapes[] = {{2, 2 * cp * 3, 4, 2, 7}, {2, 2 * cp * 5, 6, 1, 7},
                          {2, 2 * cp * 3, 3, 3, 7}};
  for (const Shape& sh : shapes) check_shape(mesh, sh, seed + (unsigned)sh.NH);
  std::printf("test_ring_gqa rank %d: %d checks, %d failed\n", world_rank, results.checks,
              results.failures);
  mesh_destroy(mesh);
  runtime_finalize();
  return results.exit_status();
}
