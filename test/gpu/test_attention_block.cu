// test/gpu/test_attention_block.cu - ring attention's block ops on the GPU
// (kernels/cuda/attention_block.cu; copy_columns in kernels/cuda/reduce.cu) against the CPU
// oracle (ref::). NEVER RUN: written and compiled on a machine without a GPU.
//
// attention_block_forward / attention_block_backward, causal and full blocks, fp32 and bf16, on
// shapes that take both head-size configurations (HS <= 64, HS <= 128), the 16-byte and the
// scalar tile loads (bf16 HS = 20 is not a whole number of 8-element packs), ragged tiles (T not a
// multiple of 64 or 32) and one token. The oracle runs in fp32 on the inputs as the GPU sees them
// (rounded to bf16 for bf16 runs). The backward is checked on its own: both sides get the
// oracle's out (stored as dt) and lse as the final ones, and dq, dkv start at random values
// ("+="): the increments are compared. Tolerances (relative L2 error): out fp32 1e-5, bf16 1e-2
// (one rounding to bf16 on either side); lse, dq, dk, dv 1e-5 in fp32 and 1e-4 in bf16 (fp32
// math on exact inputs on both sides: these kernels use no tensor cores; lse relative to at least
// 1 per value, since at T = 1 it is one dot product that can cancel to nearly 0). dq and dk are
// zero at T = 1, so the three increments are also checked as one vector. The backward must be bitwise
// deterministic (no atomics). One larger bf16 shape prints kernel times (not on the emulator,
// GPU_TEST_EMULATED).
// Grouped-query attention: shapes with NKV < NH kv heads (qkv rows [q | k | v] with NH, NKV, NKV
// heads, kv rows [k | v] with NKV heads each; 2 and 4 query heads per kv head), both head-size
// configurations, causal and full, fp32 and bf16, the same checks; dk, dv are the sums over each
// kv head's query heads (the CPU backend's, itself checked against float64 by
// test_attention_block.py).
// Packed documents: document ids of the queries' and the keys' chunks (numbered along the
// sequence): a causal block of one chunk (rows of 1, 2 and 5 documents) and a full block whose
// keys' chunk comes earlier (its last document continues into the queries' chunk, so many query
// rows see no key: out 0 and lse -inf on both sides, compared as a large negative number), fp32
// and bf16, against the CPU backend's block with the same ids.
// copy_columns: every pair of fp32/bf16, the vector path (widths and strides multiples of 8) and
// the scalar one, bitwise against ref::copy_columns over the whole destination (columns outside
// the range must keep their values).
#include <cmath>
#include <cstring>

#include "test/gpu/harness.h"

namespace {

struct Shape {
  int B, T, NH, NKV, HS;
  size_t C() const { return (size_t)NH * HS; }
  size_t Ckv() const { return (size_t)NKV * HS; }
  size_t rows() const { return (size_t)B * T; }
  size_t lse() const { return (size_t)B * NH * T; }
};

// Columns [col0, col0 + width) of each row of a (rows, cols) matrix.
std::vector<float> columns(const std::vector<float>& x, size_t rows, size_t cols, size_t col0,
                           size_t width) {
  std::vector<float> r(rows * width);
  for (size_t i = 0; i < rows; i++)
    std::memcpy(&r[i * width], &x[i * cols + col0], width * sizeof(float));
  return r;
}

std::vector<float> minus(const std::vector<float>& a, const std::vector<float>& b) {
  std::vector<float> r(a.size());
  for (size_t i = 0; i < a.size(); i++) r[i] = a[i] - b[i];
  return r;
}

// The oracle's results for one set of inputs.
struct Expected {
  std::vector<float> qkv, kv, dout;  // inputs, already rounded to the dtype under test
  std::vector<float> out, lse;       // forward (out rounded to dt: what the backward is given)
  std::vector<float> dq0, dkv0;      // the values dq and dkv start from
  std::vector<float> dq, dkv;        // after the backward
};

Expected cpu_reference(TestContext& ctx, const Shape& sh, bool causal, DType dt) {
  Expected e;
  const size_t C = sh.C(), Ckv = sh.Ckv(), rows = sh.rows();
  e.qkv = rounded(random_vector(ctx, rows * (C + 2 * Ckv), 1.5f), dt);
  e.kv = rounded(random_vector(ctx, rows * 2 * Ckv, 1.5f), dt);
  e.dout = rounded(random_vector(ctx, rows * C), dt);
  e.out.assign(rows * C, 0.f);
  e.lse.assign(sh.lse(), 0.f);
  ref::attention_block_forward(e.out.data(), e.lse.data(), e.qkv.data(), e.kv.data(), sh.B, sh.T,
                               sh.NH, sh.NKV, sh.HS, causal, DType::F32, ctx.ref_stream);
  e.out = rounded(e.out, dt);
  e.dq0 = random_vector(ctx, rows * C, 0.5f);
  e.dkv0 = random_vector(ctx, rows * 2 * Ckv, 0.5f);
  e.dq = e.dq0;
  e.dkv = e.dkv0;
  ref::attention_block_backward(e.dq.data(), e.dkv.data(), e.dout.data(), e.out.data(),
                                e.lse.data(), e.qkv.data(), e.kv.data(), sh.B, sh.T, sh.NH,
                                sh.NKV, sh.HS, causal, DType::F32, ctx.ref_stream);
  return e;
}

struct DeviceBuffers {
  void *qkv, *kv, *dout, *given_out, *out;
  float *given_lse, *lse, *dq, *dkv;
};

DeviceBuffers upload(const Shape& sh, const Expected& e, DType dt) {
  DeviceBuffers d;
  d.qkv = to_device(e.qkv, dt);
  d.kv = to_device(e.kv, dt);
  d.dout = to_device(e.dout, dt);
  d.given_out = to_device(e.out, dt);
  d.given_lse = (float*)to_device(e.lse, DType::F32);
  d.out = ops::alloc(sh.rows() * sh.C() * dtype_size(dt));
  d.lse = (float*)ops::alloc(sh.lse() * sizeof(float));
  d.dq = (float*)to_device(e.dq0, DType::F32);
  d.dkv = (float*)to_device(e.dkv0, DType::F32);
  return d;
}

void release(DeviceBuffers& d) {
  for (void* p : {d.qkv, d.kv, d.dout, d.given_out, d.out, (void*)d.given_lse, (void*)d.lse,
                  (void*)d.dq, (void*)d.dkv})
    ops::release(p);
}

void run_backward(const DeviceBuffers& d, const Expected& e, const Shape& sh, bool causal,
                  DType dt, ops::Stream s) {
  ops::copy_to_device(d.dq, e.dq0.data(), e.dq0.size() * sizeof(float));
  ops::copy_to_device(d.dkv, e.dkv0.data(), e.dkv0.size() * sizeof(float));
  ops::attention_block_backward(d.dq, d.dkv, d.dout, d.given_out, d.given_lse, d.qkv, d.kv, sh.B,
                                sh.T, sh.NH, sh.NKV, sh.HS, causal, dt, s);
  ops::stream_sync(s);
}

void check_backward(TestContext& ctx, const DeviceBuffers& d, const Expected& e, const Shape& sh,
                    bool causal, DType dt, const std::string& tag) {
  const size_t C = sh.C(), Ckv = sh.Ckv(), rows = sh.rows();
  run_backward(d, e, sh, causal, dt, ctx.stream);
  const std::vector<float> dq = to_host(d.dq, rows * C, DType::F32);
  const std::vector<float> dkv = to_host(d.dkv, rows * 2 * Ckv, DType::F32);
  const double tol = dt == DType::F32 ? 1e-5 : 1e-4;
  std::vector<float> got = minus(dq, e.dq0), want = minus(e.dq, e.dq0);
  const std::vector<float> got_kv = minus(dkv, e.dkv0), want_kv = minus(e.dkv, e.dkv0);
  if (sh.T > 1) {
    check_close(ctx, tag + " dq", got.data(), want.data(), got.size(), tol);
    const char* names[2] = {" dk", " dv"};
    for (int part = 0; part < 2; part++) {
      std::vector<float> g = columns(got_kv, rows, 2 * Ckv, part * Ckv, Ckv);
      std::vector<float> w = columns(want_kv, rows, 2 * Ckv, part * Ckv, Ckv);
      check_close(ctx, tag + names[part], g.data(), w.data(), g.size(), tol);
    }
  }
  got.insert(got.end(), got_kv.begin(), got_kv.end());
  want.insert(want.end(), want_kv.begin(), want_kv.end());
  check_close(ctx, tag + " dq, dk, dv", got.data(), want.data(), got.size(), tol);

  run_backward(d, e, sh, causal, dt, ctx.stream);  // again: the same bits
  const std::vector<float> dq2 = to_host(d.dq, rows * C, DType::F32);
  const std::vector<float> dkv2 = to_host(d.dkv, rows * 2 * Ckv, DType::F32);
  expect(ctx,
         std::memcmp(dq.data(), dq2.data(), dq.size() * 4) == 0 &&
             std::memcmp(dkv.data(), dkv2.data(), dkv.size() * 4) == 0,
         tag + " backward deterministic");
}

// Forward and backward of one shape; returns the device buffers (for timing), to be released.
DeviceBuffers check_case(TestContext& ctx, const Shape& sh, bool causal, DType dt,
                         const Expected& e) {
  char label[128];
  std::snprintf(label, sizeof(label), "block %s %s B=%d T=%d NH=%d NKV=%d HS=%d", dtype_name(dt),
                causal ? "causal" : "full", sh.B, sh.T, sh.NH, sh.NKV, sh.HS);
  const std::string tag = label;
  DeviceBuffers d = upload(sh, e, dt);
  poison(d.out, sh.rows() * sh.C() * dtype_size(dt));
  poison(d.lse, sh.lse() * sizeof(float));
  ops::attention_block_forward(d.out, d.lse, d.qkv, d.kv, sh.B, sh.T, sh.NH, sh.NKV, sh.HS, causal,
                               dt, ctx.stream);
  ops::stream_sync(ctx.stream);
  const bool f32 = dt == DType::F32;
  check_close(ctx, tag + " out", to_host(d.out, sh.rows() * sh.C(), dt).data(), e.out.data(),
              e.out.size(), f32 ? 1e-5 : 1e-2);
  check_close_floor(ctx, tag + " lse", to_host(d.lse, sh.lse(), DType::F32).data(),
                    e.lse.data(), e.lse.size(), f32 ? 1e-5 : 1e-4, 1.0);
  check_backward(ctx, d, e, sh, causal, dt, tag);
  return d;
}


const Shape kShapes[] = {{3, 1, 2, 2, 64},   {2, 37, 3, 3, 20}, {1, 70, 2, 2, 64},
                         {2, 65, 2, 2, 8},   {1, 100, 1, 1, 96}, {2, 130, 3, 3, 128}};
// Grouped-query attention: 2 and 4 query heads per kv head, vector and scalar loads, both head
// size configurations, one token.
const Shape kGqaShapes[] = {{2, 37, 6, 3, 20}, {1, 70, 4, 1, 64}, {2, 1, 4, 2, 64},
                            {1, 67, 4, 2, 128}};

// --- packed documents ---------------------------------------------------------------------------

int* ints_to_device(const std::vector<int>& v) {
  int* d = (int*)ops::alloc(v.size() * sizeof(int));
  ops::copy_to_device(d, v.data(), v.size() * sizeof(int));
  return d;
}

// -inf (a row that sees no key of the block) as -1e4, so that both sides compare.
std::vector<float> finite(std::vector<float> v) {
  for (float& x : v)
    if (std::isinf(x) && x < 0) x = -1e4f;
  return v;
}

void check_documents(TestContext& ctx, const Shape& sh, bool causal, DType dt) {
  std::vector<int> q_ids((size_t)sh.B * sh.T), k_ids(q_ids.size());
  for (int b = 0; b < sh.B; b++)
    for (int t = 0; t < sh.T; t++) {
      const int per = b % 3 == 0 ? sh.T : b % 3 == 1 ? sh.T / 2 + 1 : sh.T / 5 + 1;  // doc length
      k_ids[(size_t)b * sh.T + t] = t / per;
      q_ids[(size_t)b * sh.T + t] = causal ? t / per : (sh.T - 1) / per + t / per;
    }
  const size_t C = sh.C(), Ckv = sh.Ckv(), rows = sh.rows();
  std::vector<float> qkv = rounded(random_vector(ctx, rows * (C + 2 * Ckv), 1.5f), dt);
  std::vector<float> kv = rounded(random_vector(ctx, rows * 2 * Ckv, 1.5f), dt);
  std::vector<float> out(rows * C), lse(sh.lse());
  ref::attention_block_forward(out.data(), lse.data(), qkv.data(), kv.data(), sh.B, sh.T, sh.NH,
                               sh.NKV, sh.HS, causal, DType::F32, ctx.ref_stream, q_ids.data(),
                               k_ids.data());
  // The backward's final lse: this block's where it saw a key, else a finite stand-in (another
  // block held the row's document).
  std::vector<float> given_lse = finite(lse), dout = rounded(random_vector(ctx, rows * C), dt);
  out = rounded(out, dt);
  std::vector<float> dq(rows * C, 0.f), dkv(rows * 2 * Ckv, 0.f);
  ref::attention_block_backward(dq.data(), dkv.data(), dout.data(), out.data(), given_lse.data(),
                                qkv.data(), kv.data(), sh.B, sh.T, sh.NH, sh.NKV, sh.HS, causal,
                                DType::F32, ctx.ref_stream, q_ids.data(), k_ids.data());
  int* q_docs = ints_to_device(q_ids);
  int* k_docs = ints_to_device(k_ids);
  void *d_qkv = to_device(qkv, dt), *d_kv = to_device(kv, dt), *d_dout = to_device(dout, dt);
  void* d_given = to_device(out, dt);
  float* d_given_lse = (float*)to_device(given_lse, DType::F32);
  void* d_out = ops::alloc(rows * C * dtype_size(dt));
  float* d_lse = (float*)ops::alloc(sh.lse() * sizeof(float));
  float* d_dq = (float*)to_device(std::vector<float>(rows * C, 0.f), DType::F32);
  float* d_dkv = (float*)to_device(std::vector<float>(rows * 2 * Ckv, 0.f), DType::F32);
  ops::attention_block_forward(d_out, d_lse, d_qkv, d_kv, sh.B, sh.T, sh.NH, sh.NKV, sh.HS,
                               causal, dt, ctx.stream, q_docs, k_docs);
  ops::attention_block_backward(d_dq, d_dkv, d_dout, d_given, d_given_lse, d_qkv, d_kv, sh.B,
                                sh.T, sh.NH, sh.NKV, sh.HS, causal, dt, ctx.stream, q_docs,
                                k_docs);
  ops::stream_sync(ctx.stream);
  const bool f32 = dt == DType::F32;
  const std::string tag = std::string("block documents ") + dtype_name(dt) +
                          (causal ? " causal" : " full");
  check_close(ctx, tag + " out", to_host(d_out, rows * C, dt).data(), out.data(), out.size(),
              f32 ? 1e-5 : 1e-2);
  check_close_floor(ctx, tag + " lse", finite(to_host(d_lse, sh.lse(), DType::F32)).data(),
                    given_lse.data(), sh.lse(), f32 ? 1e-5 : 1e-4, 1.0);
  check_close(ctx, tag + " dq", to_host(d_dq, rows * C, DType::F32).data(), dq.data(), dq.size(),
              f32 ? 1e-5 : 1e-4);
  check_close(ctx, tag + " dk, dv", to_host(d_dkv, rows * 2 * Ckv, DType::F32).data(),
              dkv.data(), dkv.size(), f32 ? 1e-5 : 1e-4);
  for (void* p : {(void*)q_docs, (void*)k_docs, d_qkv, d_kv, d_dout, d_given, (void*)d_given_lse,
                  d_out, (void*)d_lse, (void*)d_dq, (void*)d_dkv})
    ops::release(p);
}

// --- copy_columns ------------------------------------------------------------------------------

// Host bytes of values stored as dt (bf16: rounded).
std::vector<unsigned char> host_bytes(const std::vector<float>& v, DType dt) {
  std::vector<unsigned char> bytes(v.size() * dtype_size(dt));
  for (size_t i = 0; i < v.size(); i++) {
    if (dt == DType::F32) {
      std::memcpy(&bytes[i * 4], &v[i], 4);
    } else {
      const uint16_t h = f32_to_bf16(v[i]);
      std::memcpy(&bytes[i * 2], &h, 2);
    }
  }
  return bytes;
}

struct CopyCase {
  int rows, src_cols, src_col0, dst_cols, dst_col0, width;
};

void check_copy(TestContext& ctx, const CopyCase& c, DType dst_dt, DType src_dt) {
  const std::vector<float> src = random_vector(ctx, (size_t)c.rows * c.src_cols, 100.f);
  const std::vector<float> dst = random_vector(ctx, (size_t)c.rows * c.dst_cols);
  std::vector<unsigned char> want = host_bytes(dst, dst_dt);
  const std::vector<unsigned char> src_host = host_bytes(src, src_dt);
  ref::copy_columns(want.data() + c.dst_col0 * dtype_size(dst_dt), c.dst_cols, dst_dt,
                    src_host.data() + c.src_col0 * dtype_size(src_dt), c.src_cols, src_dt, c.rows,
                    c.width, ctx.ref_stream);
  void* d_src = to_device(src, src_dt);
  void* d_dst = to_device(dst, dst_dt);
  ops::copy_columns((char*)d_dst + c.dst_col0 * dtype_size(dst_dt), c.dst_cols, dst_dt,
                    (const char*)d_src + c.src_col0 * dtype_size(src_dt), c.src_cols, src_dt,
                    c.rows, c.width, ctx.stream);
  ops::stream_sync(ctx.stream);
  const std::vector<float> got = to_host(d_dst, dst.size(), dst_dt);
  bool same = true;
  for (size_t i = 0; i < got.size(); i++)
    same = same && same_bits(got[i], element_as_float(want.data(), i, dst_dt));
  char what[160];
  std::snprintf(what, sizeof(what), "copy_columns %s->%s %dx%d of %d at %d into %d at %d",
                dtype_name(src_dt), dtype_name(dst_dt), c.rows, c.width, c.src_cols, c.src_col0,
                c.dst_cols, c.dst_col0);
  expect(ctx, same, what);
  ops::release(d_src);
  ops::release(d_dst);
}

// Every shape, causal and full, fp32 and bf16.
template <size_t N>
void check_shapes(TestContext& ctx, const Shape (&shapes)[N]) {
  for (DType dt : {DType::F32, DType::BF16})
    for (const Shape& sh : shapes)
      for (bool causal : {true, false}) {
        DeviceBuffers d = check_case(ctx, sh, causal, dt, cpu_reference(ctx, sh, causal, dt));
        release(d);
      }
}

}  // namespace

GPU_TEST(attention_block) { check_shapes(ctx, kShapes); }
GPU_TEST(attention_block_gqa) { check_shapes(ctx, kGqaShapes); }
GPU_TEST(attention_block_documents) {  // ids in both chunks; tiles of other documents skipped
  for (DType dt : {DType::F32, DType::BF16})
    for (bool causal : {true, false}) check_documents(ctx, {3, 70, 4, 2, 20}, causal, dt);
}

GPU_TEST(attention_block_timing) {  // one ring block of GPT-2 124M at T = 4096 over cp = 4
  if (ctx.emulated) {
    std::printf("  skipped: timings mean nothing on the emulator\n");
    return;
  }
  const Shape sh{4, 512, 12, 12, 64};
  const DType dt = DType::BF16;
  DeviceBuffers d = check_case(ctx, sh, false, dt, cpu_reference(ctx, sh, false, dt));
  const double fwd_flops = 4.0 * sh.B * sh.NH * (double)sh.T * sh.T * sh.HS;
  for (bool causal : {false, true}) {
    const double flops = causal ? fwd_flops / 2 : fwd_flops;
    report_time(causal ? "block forward (causal)" : "block forward (full)", flops, ctx.stream,
                [&] {
                  ops::attention_block_forward(d.out, d.lse, d.qkv, d.kv, sh.B, sh.T, sh.NH,
                                               sh.NKV, sh.HS, causal, dt, ctx.stream);
                });
    report_time(causal ? "block backward (causal)" : "block backward (full)", 2.5 * flops,
                ctx.stream, [&] {
                  ops::attention_block_backward(d.dq, d.dkv, d.dout, d.given_out, d.given_lse,
                                                d.qkv, d.kv, sh.B, sh.T, sh.NH, sh.NKV, sh.HS,
                                                causal, dt, ctx.stream);
                });
  }
  release(d);
}

GPU_TEST(copy_columns) {
  const CopyCase cases[] = {
      {37, 3 * 64, 64, 2 * 64, 0, 128},  // k, v out of qkv into kv: the 16-byte path
      {37, 3 * 21, 21, 2 * 21, 0, 42},   // the same with C = 21: one element at a time
      {37, 21, 0, 3 * 21, 42, 21},       // dv into the v columns of a dqkv
      {1, 5, 0, 5, 0, 5},
  };
  for (DType dst_dt : {DType::F32, DType::BF16})
    for (DType src_dt : {DType::F32, DType::BF16})
      for (const CopyCase& c : cases) check_copy(ctx, c, dst_dt, src_dt);
}
