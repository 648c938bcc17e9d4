// test/gpu/test_attention.cu - causal attention on the GPU (kernels/cuda/attention.cu) against the
// CPU backend: forward (out and lse) and backward (dqkv), fp32 and bf16, each implementation
// forced through StreamOptions::attention (Flash; Cudnn, which must really run cuDNN on the bf16
// shapes it supports and falls back to the hand-written kernels elsewhere; and Auto).
//
// The oracle is ref:: in fp32 on the inputs as the GPU sees them (rounded to bf16 for bf16 runs),
// so the bf16 tolerance only has to cover the GPU's own bf16 roundings. Backward is checked in
// isolation: it gets the oracle's out (stored as dt) and lse, not the GPU forward's.
// Tolerances (relative L2 error): fp32 1e-5 everywhere; bf16 1e-2 for out and dqkv, 1e-4 for lse
// (fp32 math on exact bf16 inputs). lse errors are relative to at least 1 per value (harness.h,
// check_close_floor): at T = 1 an lse is one dot product, which can cancel to nearly 0. dq and dk
// are analytically zero at T = 1, so dqkv is also checked as a whole. The bf16 GPT-2 shape
// additionally checks that backward is bitwise deterministic and prints kernel times. On the
// emulator (GPU_TEST_EMULATED) the GPT-2 and head size 128 shapes shrink, there are no timings,
// and "cudnn" may fall back (the emulator has no cuDNN engine), which exercises the fallback path
// instead.
// Grouped-query attention (NKV kv heads < NH query heads, qkv rows [q | k | v] with NH, NKV, NKV
// heads): NH/NKV = 2 and NH with one kv head; the generic kernels (fp32, and bf16 at HS = 20), the
// flash kernels (bf16 at HS 64 and 128: one token, ragged tiles, several key blocks); dq, dk and
// dv each against the CPU backend (itself checked against float64 by test_ops.py), the backward
// deterministic, and "cudnn" / "auto" must resolve to the hand-written kernels (cuDNN's graph
// here is built for NKV = NH).
// Packed documents (docs: per-token document ids; rows of 1, 2 and 5 documents, and a row that
// starts with an end-of-text): out, lse and dq, dk, dv against the CPU backend's block-causal
// attention, fp32 (the generic kernels) and bf16 (the flash kernels at HS 64 and 128, the generic
// ones at HS 20), each implementation asked for: all must end on the hand-written kernels (cuDNN
// has no document mask here), the backward deterministic. The flash kernels' document mask
// (attention_flash_documents.cuh) on awkward T (not a multiple of any tile), GQA, documents
// whose boundaries fall on a tile edge, inside a tile, one token long and on the last token
// (a row beginning mid-document is, to the kernels, one whose first document starts at 0:
// test/test_documents.py plants it in the trainer's data), within the causal flash tolerances;
// and the work skipped: on the emulator the kernels count the (warp, tile) steps they compute,
// which must equal, per kernel, the number of (warp, tile) pairs in which some query sees some
// key (counted here by brute force over the pairs), against the causal kernels' exact count.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cuda/attention_flash_backward.cuh"
#include "kernels/cuda/cuda_common.cuh"
#include "test/gpu/harness.h"

namespace {

struct Shape {
  int B, T, NH, NKV, HS;
  size_t qkv() const { return (size_t)B * T * (NH + 2 * NKV) * HS; }
  size_t out() const { return (size_t)B * T * NH * HS; }
  size_t lse() const { return (size_t)B * NH * T; }
};

// The CPU oracle's results for one set of inputs.
struct Expected {
  std::vector<float> qkv, dout;  // inputs, already rounded to the dtype under test
  std::vector<float> out, lse, dqkv;
};

// docs: per-token document ids (B,T) for block-causal attention, or null for plain causal.
Expected cpu_reference(TestContext& ctx, const Shape& sh, DType dt, const int* docs = nullptr) {
  Expected e;
  e.qkv = rounded(random_vector(ctx, sh.qkv()), dt);
  e.dout = rounded(random_vector(ctx, sh.out()), dt);
  e.out.assign(sh.out(), 0.f);
  e.lse.assign(sh.lse(), 0.f);
  e.dqkv.assign(sh.qkv(), 0.f);
  ref::attention_forward(e.out.data(), e.lse.data(), e.qkv.data(), sh.B, sh.T, sh.NH, sh.NKV,
                         sh.HS, DType::F32, ctx.ref_stream, docs);
  ref::attention_backward(e.dqkv.data(), e.dout.data(), e.qkv.data(), e.out.data(), e.lse.data(),
                          sh.B, sh.T, sh.NH, sh.NKV, sh.HS, DType::F32, ctx.ref_stream, docs);
  return e;
}

// Elements of the q (part 0), k (1) or v (2) columns of a (B*T, (NH+2NKV)HS) matrix.
std::vector<float> qkv_part(const std::vector<float>& x, const Shape& sh, int part) {
  const size_t C = (size_t)sh.NH * sh.HS, Ckv = (size_t)sh.NKV * sh.HS;
  const size_t rows = (size_t)sh.B * sh.T, ld = C + 2 * Ckv;
  const size_t col0 = part == 0 ? 0 : C + (part - 1) * Ckv, width = part == 0 ? C : Ckv;
  std::vector<float> r(rows * width);
  for (size_t i = 0; i < rows; i++)
    std::memcpy(&r[i * width], &x[i * ld + col0], width * sizeof(float));
  return r;
}

const char* impl_label(AttentionImpl impl) {
  return impl == AttentionImpl::Flash ? "flash" : impl == AttentionImpl::Cudnn ? "cudnn" : "auto";
}

// After a call the direction must have resolved, and an explicit "cudnn" on a shape cuDNN
// supports (bf16, head size a multiple of 8, no grouped-query attention, not a one-token
// backward) must really have run cuDNN, not the fallback: otherwise these tests would pass without
// ever exercising the cuDNN graphs. With GQA every choice must end on the hand-written kernels.
// At the GPT-2 and head size 128 shapes (T >= 512), "auto" must have picked cuDNN: its fused
// engines are expected to beat the hand-written kernels there, and the times are printed below.
void expect_resolved(TestContext& ctx, const Shape& sh, DType dt, AttentionImpl wanted,
                     AttentionImpl got, bool backward, const std::string& what) {
  ctx.checks++;
  const char* problem = nullptr;
  const bool cudnn_supported = dt == DType::BF16 && sh.HS % 8 == 0 && sh.HS <= 128 &&
                               sh.NKV == sh.NH && !(backward && sh.T == 1);
  if (got == AttentionImpl::Auto) problem = "still auto after a call";
  if (wanted == AttentionImpl::Auto && cudnn_supported && sh.T >= 512 && !ctx.emulated &&
      got != AttentionImpl::Cudnn)
    problem = "auto did not pick cuDNN at a long bf16 shape (see the times)";
  if (sh.NKV != sh.NH && got != AttentionImpl::Flash)
    problem = "grouped-query attention must take the hand-written kernels";
  if (wanted == AttentionImpl::Cudnn && cudnn_supported && got != AttentionImpl::Cudnn &&
      !ctx.emulated)
    problem = "cuDNN could not run a shape it supports (see the warning above)";
  if (problem) {
    ctx.failures++;
    std::printf("  %-48s FAIL (%s)\n", (what + " resolved").c_str(), problem);
  }
}

struct DeviceBuffers {
  void *qkv, *dout, *out, *dqkv, *ref_out;
  float *lse, *ref_lse;
};

DeviceBuffers upload(const Shape& sh, const Expected& e, DType dt) {
  DeviceBuffers d;
  d.qkv = to_device(e.qkv, dt);
  d.dout = to_device(e.dout, dt);
  d.ref_out = to_device(e.out, dt);
  d.ref_lse = (float*)to_device(e.lse, DType::F32);
  d.out = ops::alloc(sh.out() * dtype_size(dt));
  d.dqkv = ops::alloc(sh.qkv() * dtype_size(dt));
  d.lse = (float*)ops::alloc(sh.lse() * sizeof(float));
  return d;
}
void release(DeviceBuffers& d) {
  for (void* p : {d.qkv, d.dout, d.out, d.dqkv, d.ref_out, (void*)d.lse, (void*)d.ref_lse})
    ops::release(p);
}

void run_backward(const DeviceBuffers& d, const Shape& sh, DType dt, ops::Stream s) {
  ops::attention_backward(d.dqkv, d.dout, d.qkv, d.ref_out, d.ref_lse, sh.B, sh.T, sh.NH, sh.NKV,
                          sh.HS, dt, s);
}

// Backward twice on poisoned outputs: the two results must agree bit for bit.
void check_deterministic(TestContext& ctx, const DeviceBuffers& d, const Shape& sh, DType dt,
                         ops::Stream s, const std::string& tag) {
  size_t bytes = sh.qkv() * dtype_size(dt);
  std::vector<unsigned char> first(bytes), second(bytes);
  ops::copy_to_host(first.data(), d.dqkv, bytes);
  poison(d.dqkv, bytes);
  run_backward(d, sh, dt, s);
  ops::stream_sync(s);
  ops::copy_to_host(second.data(), d.dqkv, bytes);
  bool same = std::memcmp(first.data(), second.data(), bytes) == 0;
  ctx.checks++;
  if (!same) ctx.failures++;
  std::printf("  %-48s %s\n", (tag + " dqkv deterministic").c_str(), same ? "ok" : "FAIL");
}


void check_impl(TestContext& ctx, const Shape& sh, DType dt, AttentionImpl impl, const Expected& e,
                bool extras) {
  StreamOptions options;
  options.attention = impl;
  ops::Stream s = ops::stream_create(options);
  DeviceBuffers d = upload(sh, e, dt);
  poison(d.out, sh.out() * dtype_size(dt));
  poison(d.lse, sh.lse() * sizeof(float));
  poison(d.dqkv, sh.qkv() * dtype_size(dt));

  ops::attention_forward(d.out, d.lse, d.qkv, sh.B, sh.T, sh.NH, sh.NKV, sh.HS, dt, s);
  ops::stream_sync(s);
  const bool f32 = dt == DType::F32;
  std::string tag = std::string(impl_label(impl)) + "->" + ops::attention_impl_name(s);
  check_close(ctx, tag + " out", to_host(d.out, sh.out(), dt).data(), e.out.data(), sh.out(),
              f32 ? 1e-5 : 1e-2);
  check_close_floor(ctx, tag + " lse", to_host(d.lse, sh.lse(), DType::F32).data(),
                    e.lse.data(), sh.lse(), f32 ? 1e-5 : 1e-4, 1.0);
  expect_resolved(ctx, sh, dt, impl, s->attention_forward_impl, false, tag + " forward");

  run_backward(d, sh, dt, s);
  ops::stream_sync(s);
  tag = std::string(impl_label(impl)) + "->" + ops::attention_impl_name(s);
  expect_resolved(ctx, sh, dt, impl, s->attention_backward_impl, true, tag + " backward");
  std::vector<float> dqkv = to_host(d.dqkv, sh.qkv(), dt);
  const double tol = f32 ? 1e-5 : 1e-2;
  check_close(ctx, tag + " dqkv", dqkv.data(), e.dqkv.data(), sh.qkv(), tol);
  if (sh.T > 1) {
    const char* names[3] = {" dq", " dk", " dv"};
    for (int part = 0; part < 3; part++) {
      std::vector<float> got = qkv_part(dqkv, sh, part), want = qkv_part(e.dqkv, sh, part);
      check_close(ctx, tag + names[part], got.data(), want.data(), got.size(), tol);
    }
  }

  if (extras) check_deterministic(ctx, d, sh, dt, s, tag);
  if (extras && !ctx.emulated) {
    double fwd_flops = 4.0 * sh.B * sh.NH * (double)sh.T * sh.T * sh.HS / 2;
    report_time((tag + " forward").c_str(), fwd_flops, s, [&] {
      ops::attention_forward(d.out, d.lse, d.qkv, sh.B, sh.T, sh.NH, sh.NKV, sh.HS, dt, s);
    });
    report_time((tag + " backward").c_str(), 2.5 * fwd_flops, s,
                [&] { run_backward(d, sh, dt, s); });
  }
  release(d);
  ops::stream_destroy(s);
}

void run_case(TestContext& ctx, const Shape& sh, DType dt, bool extras = false) {
  std::printf("  B=%d T=%d NH=%d NKV=%d HS=%d %s\n", sh.B, sh.T, sh.NH, sh.NKV, sh.HS,
              dtype_name(dt));
  Expected e = cpu_reference(ctx, sh, dt);
  for (AttentionImpl impl : {AttentionImpl::Flash, AttentionImpl::Cudnn, AttentionImpl::Auto})
    check_impl(ctx, sh, dt, impl, e, extras);
}

// Document ids of B rows of T: row b % 3 holds 1, 2 or 5 documents (the last starting at 0).
std::vector<int> document_ids(int B, int T) {
  std::vector<int> ids((size_t)B * T);
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++) {
      const int kind = b % 3;
      ids[(size_t)b * T + t] = kind == 0 ? 0 : kind == 1 ? (t >= T / 2) : (5 * t) / T;
    }
  return ids;
}

// Document ids for the flash kernels' tiles (T >= 70): row b % 3 holds 1 document; 2, the second
// starting inside a tile (T/2 + 3); or 5, starting at 0, T/5, 64 (a tile edge), 65 (so the third
// is one token long) and T - 1 (a one-token document on the last row).
std::vector<int> flash_document_ids(int B, int T) {
  std::vector<int> ids((size_t)B * T);
  const int five[5] = {0, T / 5, 64, 65, T - 1};
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++) {
      int doc = 0;
      if (b % 3 == 1) doc = t >= T / 2 + 3;
      if (b % 3 == 2)
        for (int k = 1; k < 5; k++) doc += t >= five[k];
      ids[(size_t)b * T + t] = doc;
    }
  return ids;
}

// (warp, tile) steps of the three flash kernels (attention_flash_documents.cuh's census).
struct TileCounts {
  long long forward = 0, dq = 0, dkdv = 0;
  TileCounts operator-(const TileCounts& o) const {
    return {forward - o.forward, dq - o.dq, dkdv - o.dkdv};
  }
  TileCounts times(long long k) const { return {forward * k, dq * k, dkdv * k}; }
  bool operator==(const TileCounts& o) const {
    return forward == o.forward && dq == o.dq && dkdv == o.dkdv;
  }
};

TileCounts tile_census() {
  TileCounts c;
#ifdef GPT5D_EMULATED_CUDA
  c.forward = attention_flash::tile_census[attention_flash::kForwardTiles].load();
  c.dq = attention_flash::tile_census[attention_flash::kDqTiles].load();
  c.dkdv = attention_flash::tile_census[attention_flash::kDkDvTiles].load();
#endif
  return c;
}

// Whether some query of rows [q0, q0 + nq) sees some key of [k0, k0 + nk) of one sequence (ids:
// its T document ids, or null for causal), by brute force over the pairs.
bool any_visible(const int* ids, int T, int q0, int nq, int k0, int nk) {
  for (int q = q0; q < std::min(q0 + nq, T); q++)
    for (int k = k0; k < std::min(k0 + nk, q + 1); k++)
      if (!ids || ids[k] == ids[q]) return true;
  return false;
}

// Per (sequence, query head): the (warp, tile) pairs a kernel that computes exactly the pairs
// with a visible key would visit, for warps of `warp_rows` rows against tiles of `tile_rows`
// (rows_are_queries false: the warps hold keys, the dK/dV kernel).
long long visible_pairs(const int* ids, int T, int warp_rows, int tile_rows,
                        bool rows_are_queries) {
  long long n = 0;
  for (int w = 0; w < T; w += warp_rows)
    for (int t = 0; t < T; t += tile_rows)
      n += rows_are_queries ? any_visible(ids, T, w, warp_rows, t, tile_rows)
                            : any_visible(ids, T, t, tile_rows, w, warp_rows);
  return n;
}

// What the flash kernels count with document ids (every sequence, every query head).
template <int D>
TileCounts expected_document_tiles(const std::vector<int>& ids, const Shape& sh) {
  using Fwd = attention_flash::ForwardConfig<D>;
  using Bwd = attention_flash::BackwardConfig<D>;
  TileCounts c;
  for (int b = 0; b < sh.B; b++) {
    const int* row = ids.data() + (size_t)b * sh.T;
    c.forward += sh.NH * visible_pairs(row, sh.T, Fwd::kWarpRows, Fwd::kBlockN, true);
    c.dq += sh.NH * visible_pairs(row, sh.T, 16, Bwd::kKeysPerStep, true);
    c.dkdv += sh.NH * visible_pairs(row, sh.T, 16, Bwd::kQueriesPerStep, false);
  }
  return c;
}

int div_up(int x, int m) { return (x + m - 1) / m; }

// What the causal flash kernels count: every warp of a block (also one whose rows are all past T)
// computes each tile of the block's walk that is not wholly in its future.
template <int D>
TileCounts expected_causal_tiles(const Shape& sh) {
  using Fwd = attention_flash::ForwardConfig<D>;
  using Bwd = attention_flash::BackwardConfig<D>;
  const int T = sh.T;
  TileCounts c;
  for (int m0 = 0; m0 < T; m0 += Fwd::kBlockM) {
    const int tiles = std::min(div_up(T, Fwd::kBlockN), div_up(m0 + Fwd::kBlockM, Fwd::kBlockN));
    for (int w = m0; w < m0 + Fwd::kBlockM; w += Fwd::kWarpRows)
      for (int n = 0; n < tiles; n++) c.forward += n * Fwd::kBlockN <= w + Fwd::kWarpRows - 1;
  }
  for (int q0 = 0; q0 < T; q0 += Bwd::kQueriesPerBlock) {
    const int tiles = std::min(div_up(T, Bwd::kKeysPerStep),
                               div_up(q0 + Bwd::kQueriesPerBlock, Bwd::kKeysPerStep));
    for (int w = q0; w < q0 + Bwd::kQueriesPerBlock; w += 16)
      for (int n = 0; n < tiles; n++) c.dq += n * Bwd::kKeysPerStep <= w + 15;
  }
  for (int key0 = 0; key0 < T; key0 += Bwd::kKeysPerBlock)
    for (int w = key0; w < key0 + Bwd::kKeysPerBlock; w += 16)
      for (int m = key0 / Bwd::kQueriesPerStep; m < div_up(T, Bwd::kQueriesPerStep); m++)
        c.dkdv += w <= m * Bwd::kQueriesPerStep + Bwd::kQueriesPerStep - 1;
  return c.times((long long)sh.B * sh.NH);
}

// Forward, then backward from the oracle's out and lse, with document ids `ids` (null: causal);
// returns the flash kernels' census over the two calls.
TileCounts run_documents(const DeviceBuffers& d, const Shape& sh, DType dt, ops::Stream s,
                         const int* docs) {
  ops::stream_sync(s);
  const TileCounts before = tile_census();
  ops::attention_forward(d.out, d.lse, d.qkv, sh.B, sh.T, sh.NH, sh.NKV, sh.HS, dt, s, docs);
  ops::attention_backward(d.dqkv, d.dout, d.qkv, d.ref_out, d.ref_lse, sh.B, sh.T, sh.NH, sh.NKV,
                          sh.HS, dt, s, docs);
  ops::stream_sync(s);
  return tile_census() - before;
}

// Block-causal attention with document ids `ids` through implementation `impl` against the CPU
// backend; returns the flash kernels' census of the forward and backward call.
TileCounts check_documents(TestContext& ctx, const Shape& sh, DType dt, AttentionImpl impl,
                           const std::vector<int>& ids) {
  Expected e = cpu_reference(ctx, sh, dt, ids.data());
  e.out = rounded(e.out, dt);
  StreamOptions options;
  options.attention = impl;
  ops::Stream s = ops::stream_create(options);
  DeviceBuffers d = upload(sh, e, dt);
  int* docs = (int*)ops::alloc(ids.size() * sizeof(int));
  ops::copy_to_device(docs, ids.data(), ids.size() * sizeof(int));
  const TileCounts census = run_documents(d, sh, dt, s, docs);
  const bool f32 = dt == DType::F32;
  char label[128];
  std::snprintf(label, sizeof(label), "documents T=%d NH=%d NKV=%d HS=%d %s %s->%s", sh.T, sh.NH,
                sh.NKV, sh.HS, dtype_name(dt), impl_label(impl), ops::attention_impl_name(s));
  const std::string tag = label;
  expect(ctx, s->attention_forward_impl == AttentionImpl::Flash &&
                  s->attention_backward_impl == AttentionImpl::Flash,
         tag + " took the hand-written kernels");
  check_close(ctx, tag + " out", to_host(d.out, sh.out(), dt).data(), e.out.data(), sh.out(),
              f32 ? 1e-5 : 1e-2);
  check_close_floor(ctx, tag + " lse", to_host(d.lse, sh.lse(), DType::F32).data(),
                    e.lse.data(), sh.lse(), f32 ? 1e-5 : 1e-4, 1.0);
  const std::vector<float> dqkv = to_host(d.dqkv, sh.qkv(), dt);
  const char* names[3] = {" dq", " dk", " dv"};
  for (int part = 0; part < 3; part++) {
    std::vector<float> got = qkv_part(dqkv, sh, part), want = qkv_part(e.dqkv, sh, part);
    check_close(ctx, tag + names[part], got.data(), want.data(), got.size(), f32 ? 1e-5 : 1e-2);
  }
  std::vector<unsigned char> again(sh.qkv() * dtype_size(dt)), first(again.size());
  ops::copy_to_host(first.data(), d.dqkv, first.size());
  poison(d.dqkv, again.size());
  ops::attention_backward(d.dqkv, d.dout, d.qkv, d.ref_out, d.ref_lse, sh.B, sh.T, sh.NH, sh.NKV,
                          sh.HS, dt, s, docs);
  ops::stream_sync(s);
  ops::copy_to_host(again.data(), d.dqkv, again.size());
  expect(ctx, std::memcmp(first.data(), again.data(), again.size()) == 0,
         tag + " dqkv deterministic");
  ops::release(docs);
  release(d);
  ops::stream_destroy(s);
  return census;
}

// The flash kernels with document ids: each implementation asked for, then the work skipped.
template <int D>
void check_flash_documents(TestContext& ctx, const Shape& sh) {
  std::printf("  B=%d T=%d NH=%d NKV=%d HS=%d bf16, documents\n", sh.B, sh.T, sh.NH, sh.NKV,
              sh.HS);
  const std::vector<int> ids = flash_document_ids(sh.B, sh.T);
  TileCounts documents;
  for (AttentionImpl impl : {AttentionImpl::Flash, AttentionImpl::Auto, AttentionImpl::Cudnn}) {
    TileCounts census = check_documents(ctx, sh, DType::BF16, impl, ids);
    if (impl == AttentionImpl::Flash) documents = census;  // "auto" times the kernels: more
  }
  if (!ctx.emulated) return;  // a GPU build keeps no census
  // The causal kernels on the same shape, whose count is known exactly: how many times the
  // emulator ran each launch (EMU_ORDER may run it under several thread orders).
  Expected e = cpu_reference(ctx, sh, DType::BF16);
  StreamOptions options;
  options.attention = AttentionImpl::Flash;
  ops::Stream s = ops::stream_create(options);
  DeviceBuffers d = upload(sh, e, DType::BF16);
  const TileCounts causal = run_documents(d, sh, DType::BF16, s, nullptr);
  release(d);
  ops::stream_destroy(s);
  const TileCounts causal_want = expected_causal_tiles<D>(sh);
  const long long runs = causal.forward / causal_want.forward;
  const TileCounts want = expected_document_tiles<D>(ids, sh);
  char line[256];
  std::snprintf(line, sizeof(line),
                "flash tiles computed, with documents (causal): forward %lld (%lld), dq %lld "
                "(%lld), dk/dv %lld (%lld); launches run %lldx",
                documents.forward / std::max(runs, 1LL), causal.forward / std::max(runs, 1LL),
                documents.dq / std::max(runs, 1LL), causal.dq / std::max(runs, 1LL),
                documents.dkdv / std::max(runs, 1LL), causal.dkdv / std::max(runs, 1LL), runs);
  std::printf("  %s\n", line);
  expect(ctx, runs >= 1 && causal == causal_want.times(runs), "causal flash tile census exact");
  expect(ctx, documents == want.times(runs),
         "document tile census = the (warp, tile) pairs with a visible key");
  expect(ctx, want.forward < causal_want.forward && want.dq < causal_want.dq &&
                  want.dkdv < causal_want.dkdv,
         "the document mask skips tiles in every kernel");
}

}  // namespace

GPU_TEST(attention_documents) {  // block-causal over packed documents
  for (AttentionImpl impl : {AttentionImpl::Flash, AttentionImpl::Auto}) {
    check_documents(ctx, {3, 37, 4, 2, 20}, DType::F32, impl, document_ids(3, 37));
    check_documents(ctx, {3, 70, 2, 2, 64}, DType::BF16, impl, document_ids(3, 70));
  }
}
GPU_TEST(attention_flash_documents) {  // the flash kernels' document mask and tile skipping
  check_flash_documents<64>(ctx, {3, 200, 2, 2, 64});   // 2 query blocks, a ragged last tile
  check_flash_documents<128>(ctx, {3, 160, 2, 2, 128});
  check_flash_documents<64>(ctx, {3, 130, 4, 2, 64});   // GQA: 2 query heads per kv head
  check_flash_documents<128>(ctx, {3, 97, 4, 1, 128});  // GQA: one kv head
}

GPU_TEST(attention_awkward) {
  for (DType dt : {DType::F32, DType::BF16}) run_case(ctx, {2, 37, 3, 3, 20}, dt);
}
GPU_TEST(attention_single_token) {
  for (DType dt : {DType::F32, DType::BF16}) {
    run_case(ctx, {3, 1, 2, 2, 64}, dt);
    run_case(ctx, {1, 1, 1, 1, 128}, dt);
  }
}
GPU_TEST(attention_ragged_tiles) {  // T not a multiple of any tile size, several query tiles
  // Emulated: one sequence, and T 197 with one head at D = 128 (still 4 ragged query tiles): the
  // GPU's shapes took 44 s of the emulator's CPU, a quarter of its whole test run.
  const Shape d64 = ctx.emulated ? Shape{1, 200, 2, 2, 64} : Shape{2, 200, 2, 2, 64};
  const Shape d128 = ctx.emulated ? Shape{1, 197, 1, 1, 128} : Shape{1, 333, 3, 3, 128};
  for (DType dt : {DType::F32, DType::BF16}) {
    run_case(ctx, d64, dt);
    run_case(ctx, d128, dt);
  }
}
GPU_TEST(attention_gqa) {  // grouped-query: 2 query heads per kv head, and one kv head for all
  for (DType dt : {DType::F32, DType::BF16}) {
    run_case(ctx, {2, 37, 6, 3, 20}, dt);  // generic kernels (HS 20), 2 per kv head
    run_case(ctx, {3, 1, 4, 1, 64}, dt);   // one token, one kv head
  }
  // The flash kernels (bf16 only: fp32 takes the generic kernels above): 3 key blocks and ragged
  // query tiles at D = 64, then D = 128 with one kv head.
  run_case(ctx, {2, 130, 4, 2, 64}, DType::BF16);
  run_case(ctx, {1, 97, 4, 1, 128}, DType::BF16, /*extras=*/true);
}
GPU_TEST(attention_gpt2) {  // emulated: fewer sequences, heads and positions (still 4 query tiles)
  const Shape sh = ctx.emulated ? Shape{1, 256, 2, 2, 64} : Shape{4, 1024, 12, 12, 64};
  run_case(ctx, sh, DType::F32);
  run_case(ctx, sh, DType::BF16, /*extras=*/true);
}
GPU_TEST(attention_llama3_8b) {  // one tp = 4 rank of Llama-3 8B: 8 query heads on 2 kv heads
  const Shape sh = ctx.emulated ? Shape{1, 160, 4, 1, 128} : Shape{2, 2048, 8, 2, 128};
  run_case(ctx, sh, DType::BF16, /*extras=*/true);
}
GPU_TEST(attention_head_size_128) {
  const Shape sh = ctx.emulated ? Shape{1, 192, 2, 2, 128} : Shape{2, 512, 4, 4, 128};
  run_case(ctx, sh, DType::F32);
  run_case(ctx, sh, DType::BF16, /*extras=*/true);
}
