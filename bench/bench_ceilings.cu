// bench/bench_ceilings.cu - the two ceilings every other number is a percentage of, measured in
// the same run on the same device (METHOD.md: datasheet rates are leads, measure the ceilings):
//   copy bandwidth  ops::copy_on_device (cudaMemcpyAsync device-to-device) of 1 GiB, counting
//                   the bytes read plus the bytes written (2 GiB per copy);
//   GEMM rate       ops::matmul_forward in bf16 at 8192 x 8192 x 8192 (cuBLASLt), 2*M*N*K FLOPs,
//                   on random operands (zeros run faster and would flatter every percentage).
#include "bench/bench.h"

static void bench_copy(Bench& b) {
  const size_t bytes = b.quick ? (size_t(16) << 20) : (size_t(1) << 30);
  void* src = random_device(b, bytes / 4, DType::F32, 1);
  void* dst = ops::alloc(bytes);
  const double ms = time_op(b, [&](int) { ops::copy_on_device(dst, src, bytes, b.stream); });
  b.copy_gbps = 2.0 * bytes / (ms * 1e6);
  BenchRow row{"ceiling", "device copy (cudaMemcpyAsync D2D)", b.quick ? "16 MiB" : "1 GiB",
               ms, b.copy_gbps, "GB/s", -1, "", "the memory ceiling (read+write bytes)"};
  add_row(b, row);
  ops::release(src);
  ops::release(dst);
}

static void bench_gemm_ceiling(Bench& b) {
  const int n = b.quick ? 256 : 8192;
  void* a = random_device(b, (size_t)n * n, DType::BF16, 2);
  void* w = random_device(b, (size_t)n * n, DType::BF16, 3);
  void* out = ops::alloc((size_t)n * n * 2);
  const double ms = time_op(b, [&](int) {
    ops::matmul_forward(out, nullptr, a, w, nullptr, nullptr, n, n, n, DType::BF16, b.stream);
  });
  b.gemm_tflops = 2.0 * n * n * (double)n / (ms * 1e9);
  char shape[64];
  std::snprintf(shape, sizeof(shape), "%dx%dx%d", n, n, n);
  BenchRow row{"ceiling", "bf16 GEMM (ops::matmul_forward)", shape, ms, b.gemm_tflops,
               "TFLOP/s", -1, "", "the matmul ceiling"};
  add_row(b, row);
  for (void* p : {a, w, out}) ops::release(p);
}

void bench_ceilings(Bench& b) {
  bench_copy(b);
  bench_gemm_ceiling(b);
  b.notes.push_back(
      "ceilings measured on H100 and H200 machines in earlier runs of this benchmark: H100 copy "
      "~3.0 TB/s and bf16 8192^3 GEMM ~798 TFLOP/s; H200 ~4.3 TB/s and 769-798 TFLOP/s");
}
