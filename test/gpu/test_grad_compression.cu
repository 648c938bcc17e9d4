// test/gpu/test_grad_compression.cu - the kernels of the compressed gradient reductions
// (kernels/cuda/grad_compression.cu) against the CPU backend, bit for bit: both backends round
// every division, product and sum once, in the same order (kernels/ops_decls.h), so any
// difference is a bug, not rounding.
//
// int8_quantize: awkward chunk sizes (1, 255, 257, 1000, 4099; up to 1000 on the emulator) times
// 1-5 chunks, values spanning 2^-30 .. 2^20 with an all-zero block (scale 0) and exact .5 ties
// (nearest even); error written out of place, in place (err = x) and accumulated. The packed
// records (codes, zero padding, scales) compared byte for byte after poisoning.
// int8_dequantize_sum over the records, int8_dequantize with n cutting the last record (nothing
// written past n). topk_select: n from 1 to 70001 (8193 on the emulator) across tile boundaries
// (4096), k from 1 to n (fewer cases on the emulator), with many equal magnitudes (the tie rule: lower index first) and
// all-distinct values: record and residual bitwise. topk_scatter_add: several records with
// overlapping indices into a window of a larger vector.
#include <algorithm>
#include <cstring>

#include "test/gpu/harness.h"

namespace {

constexpr size_t kBlock = 256;

std::vector<float> awkward_values(TestContext& ctx, size_t n) {
  std::vector<float> x = random_vector(ctx, n);
  std::uniform_int_distribution<int> expo(-30, 20);
  for (float& v : x) v = std::ldexp(v, expo(ctx.rng));
  if (n > 2 * kBlock) std::fill(x.begin() + kBlock, x.begin() + 2 * kBlock, 0.0f);
  if (n > 3 * kBlock + 4) {  // absmax 127 -> scale 1: 2.5 and -3.5 are ties (2 and -4)
    for (size_t i = 2 * kBlock; i < 3 * kBlock; i++) x[i] = (float)((int)(ctx.rng() % 200) - 100);
    x[2 * kBlock] = 127.0f, x[2 * kBlock + 1] = 2.5f, x[2 * kBlock + 2] = -3.5f;
  }
  return x;
}

std::vector<uint8_t> bytes_to_host(const void* dev, size_t n) {
  std::vector<uint8_t> h(n);
  ops::copy_to_host(h.data(), dev, n);
  return h;
}

bool bitwise(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

void check_dequantize(TestContext& ctx, size_t chunk_n, int chunks, const void* d_packed,
                      std::vector<uint8_t>& packed) {
  std::vector<float> want(chunk_n);
  ref::int8_dequantize_sum(want.data(), packed.data(), chunk_n, chunks, ctx.ref_stream);
  auto* d_out = static_cast<float*>(ops::alloc((chunk_n * chunks + 3) * 4));
  poison(d_out, (chunk_n * chunks + 3) * 4);
  ops::int8_dequantize_sum(d_out, d_packed, chunk_n, chunks, ctx.stream);
  expect(ctx, bitwise(to_host(d_out, chunk_n, DType::F32), want),
         "  int8_dequantize_sum of " + std::to_string(chunks) + " records bitwise");
  const size_t n = chunk_n * chunks - (size_t)(ctx.rng() % chunk_n);
  std::vector<float> want_all(n);
  ref::int8_dequantize(want_all.data(), n, packed.data(), chunk_n, chunks, ctx.ref_stream);
  poison(d_out, (chunk_n * chunks + 3) * 4);
  ops::int8_dequantize(d_out, n, d_packed, chunk_n, chunks, ctx.stream);
  const std::vector<float> got = to_host(d_out, n + 1, DType::F32);
  expect(ctx, bitwise(std::vector<float>(got.begin(), got.begin() + n), want_all) &&
                  std::isnan(got[n]),
         "  int8_dequantize into n = " + std::to_string(n) + ": bitwise, nothing past n");
  ops::release(d_out);
}

// One quantisation: CUDA's packed records and error against the CPU backend's.
void check_quantize(TestContext& ctx, size_t chunk_n, int chunks, int mode) {
  const size_t n = chunk_n * chunks, rb = int8_record_bytes(chunk_n) * chunks;
  const std::vector<float> x = awkward_values(ctx, n), err0 = random_vector(ctx, n);
  const bool accumulate = mode == 2, in_place = mode == 1;
  std::vector<uint8_t> want_packed(rb, 0xAB);
  std::vector<float> want_err = in_place ? x : err0, x_ref = x;
  ref::int8_quantize(want_packed.data(), want_err.data(), in_place ? want_err.data() : x_ref.data(),
                     chunk_n, chunks, accumulate, ctx.ref_stream);
  void* d_packed = ops::alloc(rb);
  poison(d_packed, rb);
  auto* d_x = static_cast<float*>(to_device(x, DType::F32));
  auto* d_err = in_place ? d_x : static_cast<float*>(to_device(err0, DType::F32));
  ops::int8_quantize(d_packed, d_err, d_x, chunk_n, chunks, accumulate, ctx.stream);
  const std::vector<uint8_t> got_packed = bytes_to_host(d_packed, rb);
  char name[128];
  static const char* kMode[] = {"written", "in place", "accumulated"};
  std::snprintf(name, sizeof(name), "int8_quantize chunk_n %zu x %d, error %s", chunk_n, chunks,
                kMode[mode]);
  expect(ctx, got_packed == want_packed, std::string(name) + ": records bitwise");
  expect(ctx, bitwise(to_host(d_err, n, DType::F32), want_err), std::string(name) + ": error bitwise");
  if (mode == 0) check_dequantize(ctx, chunk_n, chunks, d_packed, want_packed);
  ops::release(d_packed);
  ops::release(d_x);
  if (!in_place) ops::release(d_err);
}

void check_topk(TestContext& ctx, size_t n, size_t k, bool ties) {
  std::vector<float> x = random_vector(ctx, n);
  if (ties) {
    static const float mags[] = {0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 1e-3f, 7.0f};
    for (float& v : x) v = mags[ctx.rng() % 7] * (ctx.rng() % 2 ? 1.0f : -1.0f);
  }
  std::vector<int32_t> want_rec(2 * k, -7);
  std::vector<float> want_x = x;
  std::vector<char> scratch(topk_scratch_bytes(n));
  ref::topk_select(want_rec.data(), want_x.data(), n, k, scratch.data(), ctx.ref_stream);
  auto* d_x = static_cast<float*>(to_device(x, DType::F32));
  auto* d_rec = static_cast<int32_t*>(ops::alloc(2 * k * 4));
  void* d_scratch = ops::alloc(topk_scratch_bytes(n));
  poison(d_rec, 2 * k * 4);
  poison(d_scratch, topk_scratch_bytes(n));
  ops::topk_select(d_rec, d_x, n, k, d_scratch, ctx.stream);
  std::vector<int32_t> got_rec(2 * k);
  ops::copy_to_host(got_rec.data(), d_rec, 2 * k * 4);
  char name[96];
  std::snprintf(name, sizeof(name), "topk_select n %zu k %zu%s", n, k, ties ? " with ties" : "");
  expect(ctx, got_rec == want_rec, std::string(name) + ": record bitwise");
  expect(ctx, bitwise(to_host(d_x, n, DType::F32), want_x), std::string(name) + ": residual bitwise");
  for (void* p : {(void*)d_x, (void*)d_rec, d_scratch}) ops::release(p);
}

void check_scatter_add(TestContext& ctx, size_t n, size_t k, int records) {
  std::vector<int32_t> recs;
  for (int r = 0; r < records; r++) {
    std::vector<int32_t> idx(n);
    for (size_t i = 0; i < n; i++) idx[i] = (int32_t)i;
    std::shuffle(idx.begin(), idx.end(), ctx.rng);
    idx.resize(k);
    std::sort(idx.begin(), idx.end());
    const std::vector<float> val = random_vector(ctx, k);
    recs.insert(recs.end(), idx.begin(), idx.end());
    const int32_t* bits = reinterpret_cast<const int32_t*>(val.data());
    recs.insert(recs.end(), bits, bits + k);
  }
  const size_t first = ctx.rng() % (n / 2), out_n = 1 + ctx.rng() % (n / 2);
  std::vector<float> want = random_vector(ctx, out_n);
  auto* d_out = static_cast<float*>(to_device(want, DType::F32));
  void* d_recs = ops::alloc(recs.size() * 4);
  ops::copy_to_device(d_recs, recs.data(), recs.size() * 4);
  ref::topk_scatter_add(want.data(), first, out_n, recs.data(), k, records, ctx.ref_stream);
  ops::topk_scatter_add(d_out, first, out_n, static_cast<const int32_t*>(d_recs), k, records,
                        ctx.stream);
  expect(ctx, bitwise(to_host(d_out, out_n, DType::F32), want),
         "topk_scatter_add " + std::to_string(records) + " records of " + std::to_string(k) +
             " into " + std::to_string(out_n) + " of " + std::to_string(n) + ": bitwise");
  ops::release(d_out);
  ops::release(d_recs);
}

}  // namespace

GPU_TEST(grad_compression_int8) {
  for (size_t chunk_n : {(size_t)1, (size_t)255, (size_t)257, (size_t)1000, (size_t)4099}) {
    if (ctx.emulated && chunk_n > 1000) continue;  // the emulator runs each thread as a fiber
    for (int chunks : {1, 2, 5})
      for (int mode = 0; mode < 3; mode++) check_quantize(ctx, chunk_n, chunks, mode);
  }
}

GPU_TEST(grad_compression_topk) {
  const size_t big = ctx.emulated ? 8193 : 70001;  // three tiles on the emulator
  // The emulator switches fibers at every barrier of the block scans: half the cases there.
  for (size_t n : {(size_t)1, (size_t)7, (size_t)300, (size_t)4096, (size_t)4097, big}) {
    if (ctx.emulated && (n == 1 || n == 4096)) continue;
    for (size_t k : {(size_t)1, std::max<size_t>(1, n / 100), std::max<size_t>(1, n / 3), n}) {
      if (ctx.emulated && k == n / 100) continue;
      for (bool ties : {false, true}) check_topk(ctx, n, k, ties);
    }
  }
  check_scatter_add(ctx, 50, 7, 1);
  check_scatter_add(ctx, 1000, 100, 3);
  check_scatter_add(ctx, 20000, 1500, 4);
}
