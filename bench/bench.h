// bench/bench.h - what the kernel benchmark's sections share: the run's settings, timing of an op
// through the seam's events, device buffers filled with random values, and the result rows that
// bench_kernels prints as one table.
//
// Timing (docs/PERF.md): an op is launched a few times to warm up (module load, cuBLASLt
// heuristics, shared-memory attributes), then timed in samples of k back-to-back launches between
// two events, k chosen so that a sample lasts at least ~1 ms (launch gaps amortised); the result
// is the median over the samples, divided by k. Ops whose inputs would fit in L2 rotate over
// several buffer sets (the callback gets the launch number), so that repeated launches do not
// measure the cache. Everything goes through kernels/ops.h: on the CUDA backend the events are
// CUDA events; the same code linked with the CPU backend (bench_kernels_cpu, --quick) is the smoke
// test that runs on machines without a GPU.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kernels/ops.h"

// One line of the result table.
struct BenchRow {
  std::string section;  // "ceiling", "memory", "gemm", "attention"
  std::string name;     // op and variant
  std::string shape;
  double ms = 0;        // median time of one call
  double rate = 0;      // in `unit`
  std::string unit;     // "GB/s" (bytes read + written) or "TFLOP/s"
  double percent = -1;  // of the measured ceiling; < 0 = none
  std::string target;   // what the issue asks for, "" = none
  std::string verdict;  // "ok", "MISS by ...", or a note
};

struct Bench {
  ops::Stream stream = nullptr;
  ops::Event start = nullptr, stop = nullptr;
  bool quick = false;        // tiny sizes: the CPU smoke test, or a fast look on a GPU
  int samples = 15;          // timed samples per op (median)
  double sample_ms = 1.0;    // a sample runs at least this long (launches per sample grow)
  size_t rotate_bytes = size_t(512) << 20;  // working set spread over buffer sets (L2 < this)
  double copy_gbps = 0;      // measured device copy bandwidth, read + write bytes
  double gemm_tflops = 0;    // measured bf16 8192^3 matmul_forward rate
  std::vector<BenchRow> rows;
  std::vector<std::string> notes;  // printed under the table
  std::vector<float> random_block;  // N(0,1) values that device buffers are tiled from
};

void bench_init(Bench& b, bool quick);
void bench_destroy(Bench& b);

// Median time of one call of op(launch) in ms (see the top of the file).
double time_op(Bench& b, const std::function<void(int launch)>& op);
// How many buffer sets of `bytes_per_set` spread the rotation working set (1..16).
int buffer_sets(const Bench& b, size_t bytes_per_set);

// n random elements of dt on the device (N(0,1) * scale, or |N(0,1)| * scale when positive);
// `seed` picks where in the random block the tiling starts. Release with ops::release.
void* random_device(Bench& b, size_t n, DType dt, uint64_t seed, float scale = 1.0f,
                    bool positive = false);
// n random token ids in [0, V) on the device; distinct (optional) receives how many differ.
int* random_tokens(size_t n, int V, uint64_t seed, size_t* distinct = nullptr);

void add_row(Bench& b, BenchRow row);
// True when a row of this name and shape exists (two models can share a shape: time it once).
bool has_row(const Bench& b, const std::string& name, const std::string& shape);
// "ok" when percent >= target_percent, else "MISS by <gap> pts".
std::string verdict_at_least(double percent, double target_percent);
void print_table(const Bench& b, FILE* out);
// Tab-separated rows (one header line) for scripts: section, name, shape, ms, rate, percent.
void write_tsv(const Bench& b, const std::string& path);

// The sections (bench_ceilings.cu, bench_memory.cu, bench_matmul.cu, bench_attention.cu).
void bench_ceilings(Bench& b);   // copy bandwidth and bf16 GEMM rate: the denominators
void bench_memory(Bench& b);     // memory-bound kernels as % of the copy bandwidth
void bench_matmul(Bench& b);     // GPT-2 124M / 1.5B GEMM shapes as % of the GEMM rate
void bench_attention(Bench& b);  // attention fwd/bwd TFLOP/s per implementation

// The GPT-2 sizes the sections use (tiny stand-ins with --quick).
struct ModelShape {
  const char* name;
  int L, NH, C, V, Vp, T, B;  // B*T = rows of a micro-batch in the kernel benchmarks
  size_t parameters() const;
};
std::vector<ModelShape> bench_models(const Bench& b);
