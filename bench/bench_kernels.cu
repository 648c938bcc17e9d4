// bench/bench_kernels.cu - the kernel benchmark (bench/run_all.sh runs it; docs/PERF.md explains
// the table). Measures the two ceilings on this device in this run (copy bandwidth, bf16 GEMM
// rate), then every memory-bound kernel as % of the copy bandwidth, GPT-2's GEMM shapes as % of
// the GEMM rate, and attention TFLOP/s per implementation, and prints one table with the issue's
// targets and, where one is missed, by how much.
//
//   bench_kernels [--quick] [--samples N] [--only memory,gemm,attention] [--tsv FILE]
//
// Plain C++ over kernels/ops.h: linked with the CUDA backend it is the benchmark
// (build/bench_kernels); linked with the CPU backend (build/bench_kernels_cpu --quick) it is the
// smoke test that machines without a GPU can run. Timing: bench/bench.h.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "bench/bench.h"

struct Args {
  bool quick = false;
  int samples = 0;  // 0 = the default
  std::string only = "memory,gemm,attention";
  std::string tsv;
};

static Args parse_args(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; i++) {
    const std::string arg = argv[i];
    const bool has_value = i + 1 < argc;
    if (arg == "--quick") a.quick = true;
    else if (arg == "--samples" && has_value) a.samples = std::atoi(argv[++i]);
    else if (arg == "--only" && has_value) a.only = argv[++i];
    else if (arg == "--tsv" && has_value) a.tsv = argv[++i];
    else FATAL("usage: %s [--quick] [--samples N] [--only memory,gemm,attention] [--tsv FILE] "
               "(unknown argument '%s')", argv[0], arg.c_str());
  }
  return a;
}

static bool wanted(const Args& a, const char* section) {
  return ("," + a.only + ",").find(std::string(",") + section + ",") != std::string::npos;
}

int main(int argc, char** argv) {
  const Args args = parse_args(argc, argv);
  const DeviceInfo info = ops::device_init(0);
  Bench b;
  bench_init(b, args.quick);
  if (args.samples > 0) b.samples = args.samples;
  std::printf("bench_kernels on %s (%s backend, %d SMs/threads, %.1f GiB)%s\n", info.name,
              ops::backend_name(), info.multiprocessors, info.total_memory / 1073741824.0,
              args.quick ? " - quick sizes, not the benchmark" : "");
  std::printf("timing: median of %d samples, each >= %.1f ms of back-to-back launches, after 3 "
              "warm-up launches\n", b.samples, b.sample_ms);
  bench_ceilings(b);
  if (wanted(args, "memory")) bench_memory(b);
  if (wanted(args, "gemm")) bench_matmul(b);
  if (wanted(args, "attention")) bench_attention(b);

  std::printf("\n==== kernel benchmark: %s ====\n", info.name);
  print_table(b, stdout);
  if (!args.tsv.empty()) write_tsv(b, args.tsv);
  bench_destroy(b);
  return 0;
}
