// bench/bench_common.cu - the kernel benchmark's shared machinery (bench/bench.h): timing through
// the seam's events, random device buffers, the GPT-2 shapes, and the result table.
//
// Random buffers are tiled from one host block of N(0,1) values: the first chunk is copied from
// the host, then the filled prefix is doubled with device-to-device copies, so that even the 28 GB
// of a 1.5B-parameter AdamW state fills in a fraction of a second. The values repeat with the
// block's period; memory-bound kernels do not care, and no buffer is ever zeros.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>

#include "bench/bench.h"

void bench_init(Bench& b, bool quick) {
  b.quick = quick;
  StreamOptions options;
  options.allow_tf32 = true;  // as the trainer's bf16 runs; fp32 GEMMs are not benchmarked
  b.stream = ops::stream_create(options);
  b.start = ops::event_create();
  b.stop = ops::event_create();
  if (quick) {
    b.samples = 3;
    b.rotate_bytes = size_t(4) << 20;
  }
  std::mt19937_64 rng(20241122);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  b.random_block.resize(quick ? (1 << 16) : (1 << 22));
  for (float& x : b.random_block) x = normal(rng);
}

void bench_destroy(Bench& b) {
  ops::event_destroy(b.start);
  ops::event_destroy(b.stop);
  ops::stream_destroy(b.stream);
}

static double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Time of `launches` calls between two events, in ms.
static double time_launches(Bench& b, const std::function<void(int)>& op, int& launch,
                            int launches) {
  ops::event_record(b.start, b.stream);
  for (int i = 0; i < launches; i++) op(launch++);
  ops::event_record(b.stop, b.stream);
  ops::event_sync(b.stop);
  return ops::event_elapsed_ms(b.start, b.stop);
}

double time_op(Bench& b, const std::function<void(int)>& op) {
  constexpr int kWarmups = 3, kMaxLaunchesPerSample = 1000;
  int launch = 0;
  for (int i = 0; i < kWarmups; i++) op(launch++);
  ops::stream_sync(b.stream);
  const double one = std::max(time_launches(b, op, launch, 1), 1e-4);
  const int per_sample =
      std::clamp((int)std::ceil(b.sample_ms / one), 1, kMaxLaunchesPerSample);
  std::vector<double> per_launch;
  for (int s = 0; s < b.samples; s++)
    per_launch.push_back(time_launches(b, op, launch, per_sample) / per_sample);
  return median(per_launch);
}

int buffer_sets(const Bench& b, size_t bytes_per_set) {
  const size_t sets = ceil_div(b.rotate_bytes, std::max<size_t>(bytes_per_set, 1));
  return (int)std::clamp<size_t>(sets, 1, 16);
}

// Writes `count` values starting at block index `first` into host memory as dt.
static void fill_host(const Bench& b, void* host, size_t count, size_t first, DType dt,
                      float scale, bool positive) {
  const size_t period = b.random_block.size();
  for (size_t i = 0; i < count; i++) {
    float x = b.random_block[(first + i) % period] * scale;
    if (positive) x = std::fabs(x);
    if (dt == DType::F32) ((float*)host)[i] = x;
    else ((uint16_t*)host)[i] = f32_to_bf16(x);
  }
}

void* random_device(Bench& b, size_t n, DType dt, uint64_t seed, float scale, bool positive) {
  const size_t es = dtype_size(dt);
  char* dev = (char*)ops::alloc(std::max<size_t>(n, 1) * es);
  const size_t head = std::min(n, b.random_block.size());
  std::vector<char> host(head * es);
  fill_host(b, host.data(), head, seed % b.random_block.size(), dt, scale, positive);
  ops::copy_to_device(dev, host.data(), head * es);
  for (size_t done = head; done < n;) {  // double the filled prefix
    const size_t count = std::min(done, n - done);
    ops::copy_on_device(dev + done * es, dev, count * es, b.stream);
    done += count;
  }
  ops::stream_sync(b.stream);
  return dev;
}

int* random_tokens(size_t n, int V, uint64_t seed, size_t* distinct) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> pick(0, V - 1);
  std::vector<int> tokens(n);
  std::vector<bool> seen(V, false);
  size_t unique = 0;
  for (int& t : tokens) {
    t = pick(rng);
    if (!seen[t]) unique++;
    seen[t] = true;
  }
  if (distinct) *distinct = unique;
  int* dev = (int*)ops::alloc(n * sizeof(int));
  ops::copy_to_device(dev, tokens.data(), n * sizeof(int));
  return dev;
}

size_t ModelShape::parameters() const {
  const size_t c = C;
  return (size_t)Vp * c + (size_t)T * c + (size_t)L * (12 * c * c + 13 * c) + 2 * c;
}

std::vector<ModelShape> bench_models(const Bench& b) {
  if (b.quick)
    return {{"124M-quick", 2, 2, 64, 500, 512, 64, 2}, {"1.5B-quick", 2, 2, 128, 500, 512, 64, 2}};
  return {{"GPT-2 124M", 12, 12, 768, 50257, 50304, 1024, 8},
          {"GPT-2 1.5B", 48, 25, 1600, 50257, 50304, 1024, 8}};
}

void add_row(Bench& b, BenchRow row) {
  std::printf("  %-9s %-40s %-34s %10.3f ms %10.1f %s\n", row.section.c_str(), row.name.c_str(),
              row.shape.c_str(), row.ms, row.rate, row.unit.c_str());
  std::fflush(stdout);
  b.rows.push_back(std::move(row));
}

bool has_row(const Bench& b, const std::string& name, const std::string& shape) {
  for (const BenchRow& r : b.rows)
    if (r.name == name && r.shape == shape) return true;
  return false;
}

std::string verdict_at_least(double percent, double target_percent) {
  if (percent >= target_percent) return "ok";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "MISS by %.1f pts", target_percent - percent);
  return buf;
}

void print_table(const Bench& b, FILE* out) {
  std::string section;
  for (const BenchRow& r : b.rows) {
    if (r.section != section) {
      section = r.section;
      std::fprintf(out, "\n%-40s %-34s %11s %-15s %6s  %-12s %s\n", section.c_str(), "shape",
                   "time", "rate", "%ceil", "target", "verdict");
    }
    char pct[16] = "-";
    if (r.percent >= 0) std::snprintf(pct, sizeof(pct), "%.1f%%", r.percent);
    const double us = r.ms * 1000.0;
    char time[24];
    if (us < 10000) std::snprintf(time, sizeof(time), "%.1f us", us);
    else std::snprintf(time, sizeof(time), "%.2f ms", r.ms);
    std::fprintf(out, "%-40s %-34s %11s %7.1f %-7s %6s  %-12s %s\n", r.name.c_str(),
                 r.shape.c_str(), time, r.rate, r.unit.c_str(), pct, r.target.c_str(),
                 r.verdict.c_str());
  }
  if (!b.notes.empty()) std::fprintf(out, "\n");
  for (const std::string& n : b.notes) std::fprintf(out, "note: %s\n", n.c_str());
}

void write_tsv(const Bench& b, const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "w");
  CHECK(f, "cannot write %s", path.c_str());
  std::fprintf(f, "section\tname\tshape\tms\trate\tunit\tpercent\ttarget\tverdict\n");
  for (const BenchRow& r : b.rows)
    std::fprintf(f, "%s\t%s\t%s\t%.9g\t%.9g\t%s\t%.9g\t%s\t%s\n", r.section.c_str(),
                 r.name.c_str(), r.shape.c_str(), r.ms, r.rate, r.unit.c_str(), r.percent,
                 r.target.c_str(), r.verdict.c_str());
  std::fclose(f);
}
