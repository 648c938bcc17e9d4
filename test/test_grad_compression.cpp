// test/test_grad_compression.cpp - drives the compressed reductions of parallel/
// grad_compression.cu over MPI for test/test_grad_compression.py, which models them in numpy.
//
//   mpirun -np N test_grad_compression KIND OP n STEPS RATIO DIR
//
// KIND int8 | topk, OP allreduce (DDP: n values) | reducescatter (ZeRO: n = N * shard values).
// Rank r reads DIR/in_<r>.bin (STEPS * n float32, its gradients), runs STEPS reductions with one
// residual, and writes DIR/out_<r>.bin (per step what it received: n values, or its shard),
// DIR/residual_<r>.bin (the final residual) and DIR/bytes_<r>.txt (per collective kind the
// payload bytes parallel/comm.h counted over all steps: "all_to_all B" and "all_gather B").
#include <cstdio>
#include <string>
#include <vector>

#include "kernels/ops.h"
#include "parallel/comm.h"
#include "parallel/grad_compression.h"

static std::vector<float> read_floats(const std::string& path, size_t n) {
  std::vector<float> v(n);
  FILE* f = std::fopen(path.c_str(), "rb");
  CHECK(f && std::fread(v.data(), 4, n, f) == n, "cannot read %zu floats from %s", n, path.c_str());
  std::fclose(f);
  return v;
}

static void write_floats(const std::string& path, const std::vector<float>& v) {
  FILE* f = std::fopen(path.c_str(), "wb");
  CHECK(f && std::fwrite(v.data(), 4, v.size(), f) == v.size(), "cannot write %s", path.c_str());
  std::fclose(f);
}

static std::vector<float> download(const float* d, size_t n) {
  std::vector<float> h(n);
  ops::copy_to_host(h.data(), d, n * 4);
  return h;
}

int main(int argc, char** argv) {
  int rank = 0, size = 1, local = 0;
  runtime_init(&argc, &argv, &rank, &size, &local);
  CHECK(argc == 7, "usage: test_grad_compression int8|topk allreduce|reducescatter n steps "
        "ratio dir");
  ops::device_init(local);
  const bool all_reduce = std::string(argv[2]) == "allreduce";
  const size_t n = std::stoul(argv[3]);
  const int steps = std::stoi(argv[4]);
  const std::string dir = argv[6];
  CommStats stats{};
  Comm c;
  std::vector<int> members;
  for (int r = 0; r < size; r++) members.push_back(r);
  comm_create(c, Axis::DP, members, rank, CommBackend::MPI, &stats);
  GradCompressor gc;
  gc.kind = grad_compression_kind(argv[1]);
  gc.topk_ratio = std::stod(argv[5]);
  Allocator memory;
  grad_compressor_need(gc, n, size);
  grad_compressor_allocate(gc, memory);
  ops::Stream s = ops::stream_create(StreamOptions{});
  const size_t res_n = residual_numel(gc.kind, n, size), shard_n = n / size;
  CHECK(all_reduce || shard_n * size == n, "reducescatter: n = %zu is not a multiple of %d", n,
        size);
  float* residual = (float*)allocate_zeroed(memory, res_n * 4, s);
  float* grad = (float*)allocate(memory, n * 4);
  float* shard = (float*)allocate(memory, shard_n * 4);
  const std::vector<float> in = read_floats(dir + "/in_" + std::to_string(rank) + ".bin", steps * n);
  std::vector<float> out;
  for (int t = 0; t < steps; t++) {
    ops::copy_to_device(grad, in.data() + t * n, n * 4);
    if (all_reduce) compressed_all_reduce(gc, c, grad, residual, n, s);
    else compressed_reduce_scatter(gc, c, grad, residual, shard, shard_n, s);
    ops::stream_sync(s);
    const std::vector<float> got = download(all_reduce ? grad : shard, all_reduce ? n : shard_n);
    out.insert(out.end(), got.begin(), got.end());
  }
  write_floats(dir + "/out_" + std::to_string(rank) + ".bin", out);
  write_floats(dir + "/residual_" + std::to_string(rank) + ".bin", download(residual, res_n));
  FILE* f = std::fopen((dir + "/bytes_" + std::to_string(rank) + ".txt").c_str(), "w");
  const CommCounters& dp = stats.axis[(int)Axis::DP];
  std::fprintf(f, "all_to_all %llu\nall_gather %llu\nother %llu\n",
               (unsigned long long)dp.bytes[(int)CollectiveKind::AllToAll],
               (unsigned long long)dp.bytes[(int)CollectiveKind::AllGather],
               (unsigned long long)(dp.bytes[(int)CollectiveKind::AllReduce] +
                                    dp.bytes[(int)CollectiveKind::ReduceScatter]));
  std::fclose(f);
  ops::stream_destroy(s);
  allocator_free(memory);
  comm_destroy(c);
  runtime_finalize();
  return 0;
}
