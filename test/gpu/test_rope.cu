// test/gpu/test_rope.cu - rope_forward / rope_backward (CUDA) against the CPU oracle.
//
// The cos/sin tables (maxT, HS/2) are made here on the host the way the model makes them
// (inv_freq[j] = theta^(-2j/HS), angle = p inv_freq[j] in double, rounded to fp32) and given to
// both backends. Shapes: HS with an odd half (6, 10, 18: the scalar path), HS = 64 and 128 (the
// vector path: 16-byte packs of both halves and of the tables), NH = 6 with NKV = 2 (GQA),
// NKV = 1 and NKV = NH, T = 1; positions nullptr (p = t), a context-parallel zigzag list (rank 1
// of 3: two chunks far apart) and scattered positions near 4000 with theta = 500000; and the
// qkv buffer one element past an aligned address (the scalar path for an unaligned pointer).
// The v columns must come back bitwise untouched; q and k are compared at 1e-5 (fp32) and 1e-2
// (bf16, both backends given the same bf16 inputs).
#include <cmath>
#include <cstring>

#include "test/gpu/harness.h"

namespace {

enum class Positions { None, Zigzag, Far };

struct Case {
  int B, T, NH, NKV, HS;
  Positions positions;
  double theta;
  size_t offset;  // elements past an aligned address
};

double tolerance(DType dt) { return dt == DType::F32 ? 1e-5 : 1e-2; }

std::string label(const char* op, const Case& k, DType dt, const char* what) {
  static const char* kinds[] = {"p=t", "zigzag", "far"};
  char buf[200];
  std::snprintf(buf, sizeof(buf), "%s %s B=%d T=%d NH=%d NKV=%d HS=%d %s%s %s", op,
                dtype_name(dt), k.B, k.T, k.NH, k.NKV, k.HS, kinds[(int)k.positions],
                k.offset ? " unaligned" : "", what);
  return buf;
}

// The token positions (empty for p = t) and the tables' row count.
std::vector<int> positions_of(TestContext& ctx, const Case& k, int* maxT) {
  std::vector<int> pos;
  if (k.positions == Positions::Zigzag) {  // rank 1 of 3: chunks 1 and 4 of 6
    const int chunk = k.T / 2;
    for (int i = 0; i < k.T; i++) pos.push_back(i < chunk ? chunk + i : 4 * chunk + i - chunk);
    *maxT = 6 * chunk;
  } else if (k.positions == Positions::Far) {
    for (int i = 0; i < k.T; i++) pos.push_back(4000 + (int)(ctx.rng() % 97));
    *maxT = 4100;
  } else {
    *maxT = k.T + 3;
  }
  return pos;
}

void make_tables(std::vector<float>& cos_t, std::vector<float>& sin_t, int maxT, int HS,
                 double theta) {
  const int half = HS / 2;
  cos_t.resize((size_t)maxT * half);
  sin_t.resize((size_t)maxT * half);
  for (int p = 0; p < maxT; p++)
    for (int j = 0; j < half; j++) {
      const double angle = p * std::pow(theta, -2.0 * j / HS);
      cos_t[(size_t)p * half + j] = (float)std::cos(angle);
      sin_t[(size_t)p * half + j] = (float)std::sin(angle);
    }
}

// Runs one direction on both backends from the same input and compares.
void check_direction(TestContext& ctx, const Case& k, DType dt, bool forward) {
  const size_t W = (size_t)(k.NH + 2 * k.NKV) * k.HS, rows = (size_t)k.B * k.T;
  const size_t qk = (size_t)(k.NH + k.NKV) * k.HS, es = dtype_size(dt);
  int maxT = 0;
  auto pos = positions_of(ctx, k, &maxT);
  std::vector<float> cos_t, sin_t;
  make_tables(cos_t, sin_t, maxT, k.HS, k.theta);
  auto x = rounded(random_vector(ctx, rows * W, 1.5f), dt);

  std::vector<float> padded(k.offset, 0.0f);
  padded.insert(padded.end(), x.begin(), x.end());
  void* base = to_device(padded, dt);
  void* d_x = static_cast<char*>(base) + k.offset * es;
  auto* d_cos = static_cast<float*>(to_device(cos_t, DType::F32));
  auto* d_sin = static_cast<float*>(to_device(sin_t, DType::F32));
  int* d_pos = nullptr;
  if (!pos.empty()) {
    d_pos = static_cast<int*>(ops::alloc(pos.size() * sizeof(int)));
    ops::copy_to_device(d_pos, pos.data(), pos.size() * sizeof(int));
  }
  const int* h_pos = pos.empty() ? nullptr : pos.data();
  std::vector<float> want(x);
  if (forward) {
    ops::rope_forward(d_x, d_cos, d_sin, d_pos, k.B, k.T, k.NH, k.NKV, k.HS, dt, ctx.stream);
    ref::rope_forward(want.data(), cos_t.data(), sin_t.data(), h_pos, k.B, k.T, k.NH, k.NKV,
                      k.HS, DType::F32, ctx.ref_stream);
  } else {
    ops::rope_backward(d_x, d_cos, d_sin, d_pos, k.B, k.T, k.NH, k.NKV, k.HS, dt, ctx.stream);
    ref::rope_backward(want.data(), cos_t.data(), sin_t.data(), h_pos, k.B, k.T, k.NH, k.NKV,
                       k.HS, DType::F32, ctx.ref_stream);
  }
  const auto got = to_host(d_x, rows * W, dt);
  std::vector<float> got_qk, want_qk;
  bool v_same = true;
  for (size_t r = 0; r < rows; r++) {
    got_qk.insert(got_qk.end(), got.begin() + r * W, got.begin() + r * W + qk);
    want_qk.insert(want_qk.end(), want.begin() + r * W, want.begin() + r * W + qk);
    v_same = v_same && std::memcmp(&got[r * W + qk], &x[r * W + qk], (W - qk) * 4) == 0;
  }
  const char* op = forward ? "rope_forward" : "rope_backward";
  check_close(ctx, label(op, k, dt, "q,k"), got_qk.data(), want_qk.data(), got_qk.size(),
              tolerance(dt));
  expect(ctx, v_same, label(op, k, dt, "v untouched"));
  for (void* p : {base, (void*)d_cos, (void*)d_sin, (void*)d_pos})
    if (p) ops::release(p);
}

const Case kCases[] = {
    {3, 7, 6, 2, 10, Positions::None, 10000.0, 0},
    {2, 10, 6, 1, 6, Positions::Zigzag, 10000.0, 0},
    {1, 1, 3, 3, 10, Positions::Far, 500000.0, 0},
    {2, 13, 6, 2, 64, Positions::Far, 500000.0, 0},
    {2, 10, 4, 4, 18, Positions::Zigzag, 500000.0, 0},
    {2, 34, 8, 2, 128, Positions::Zigzag, 500000.0, 0},
    {3, 5, 6, 2, 64, Positions::None, 10000.0, 1},
    {4, 1024, 32, 8, 128, Positions::None, 500000.0, 0},  // Llama-3 8B's heads
};

}  // namespace

GPU_TEST(rope) {  // on the emulator without the model-sized case
  for (DType dt : {DType::F32, DType::BF16})
    for (const Case& k : kCases)
      if (!(ctx.emulated && k.T > 100))
        for (bool forward : {true, false}) check_direction(ctx, k, dt, forward);
}
