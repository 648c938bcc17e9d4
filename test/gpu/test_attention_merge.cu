// test/gpu/test_attention_merge.cu - attention_merge (CUDA, kernels/cuda/attention_merge.cu)
// against the CPU oracle ref::attention_merge.
//
// Shapes: one element (B = T = NH = HS = 1), awkward (2 x 5 rows, NH = 3, HS = 7), C larger than
// the block's 128 threads and not a multiple of them (NH = 5, HS = 37), and GPT-2 124M's heads
// (B = 2, T = 64, NH = 12, HS = 64). lse and lse_b are random in [-4, 4] with about one row in
// five made -inf on one side or the other, and some on both sides (an empty block, an empty
// accumulator, both). The accumulator's out holds NaN on rows whose lse is -inf (the contract
// says its values must not enter) and out_b holds NaN on rows whose lse_b is -inf.
// Checks: out and lse against the oracle (fp32 1e-5; bf16 1e-2 for out, lse 1e-5: fp32 math on
// the same inputs), the -inf pattern of lse identical, and no NaN anywhere in the results. The
// comparison maps -inf to -1e4 on both sides (check_close needs finite numbers).
#include <cmath>

#include "test/gpu/harness.h"

namespace {

struct Shape {
  int B, T, NH, HS;
};

// lse values with -inf sprinkled in: kind 0 = accumulator, 1 = block. Rows 0 mod 7 are -inf on
// both sides, 3 mod 7 only in the accumulator, 5 mod 7 only in the block.
std::vector<float> random_lse(TestContext& ctx, size_t n, int kind) {
  std::vector<float> l = random_vector(ctx, n, 4.0f);
  for (size_t i = 0; i < n; i++) {
    const size_t m = i % 7;
    if (m == 0 || (kind == 0 && m == 3) || (kind == 1 && m == 5)) l[i] = -INFINITY;
  }
  return l;
}

// out values, NaN on every (b, t, h) whose lse is -inf: those must never be read.
void poison_empty_rows(std::vector<float>& out, const std::vector<float>& lse, const Shape& s) {
  for (int b = 0; b < s.B; b++)
    for (int t = 0; t < s.T; t++)
      for (int h = 0; h < s.NH; h++)
        if (lse[((size_t)b * s.NH + h) * s.T + t] == -INFINITY)
          for (int d = 0; d < s.HS; d++)
            out[(((size_t)b * s.T + t) * s.NH + h) * s.HS + d] = NAN;
}

std::vector<float> finite_copy(std::vector<float> x) {
  for (float& v : x)
    if (v == -INFINITY) v = -1e4f;
  return x;
}

void check_shape(TestContext& ctx, const Shape& s, DType dt) {
  const size_t n = (size_t)s.B * s.T * s.NH * s.HS, nl = (size_t)s.B * s.NH * s.T;
  std::vector<float> lse = random_lse(ctx, nl, 0), lse_b = random_lse(ctx, nl, 1);
  std::vector<float> out = rounded(random_vector(ctx, n), dt);
  std::vector<float> out_b = rounded(random_vector(ctx, n), dt);
  poison_empty_rows(out, lse, s);
  poison_empty_rows(out_b, lse_b, s);

  void* d_out = to_device(out, dt);
  void* d_out_b = to_device(out_b, dt);
  void* d_lse = to_device(lse, DType::F32);
  void* d_lse_b = to_device(lse_b, DType::F32);
  ops::attention_merge(d_out, (float*)d_lse, d_out_b, (const float*)d_lse_b, s.B, s.T, s.NH,
                       s.HS, dt, ctx.stream);
  std::vector<float> want = out, want_lse = lse;
  ref::attention_merge(want.data(), want_lse.data(), out_b.data(), lse_b.data(), s.B, s.T, s.NH,
                       s.HS, DType::F32, ctx.ref_stream);
  const std::vector<float> got = to_host(d_out, n, dt), got_lse = to_host(d_lse, nl, DType::F32);

  char what[160];
  std::snprintf(what, sizeof(what), "attention_merge %s B=%d T=%d NH=%d HS=%d", dtype_name(dt),
                s.B, s.T, s.NH, s.HS);
  // Rows empty on both sides keep their NaN out (untouched); compare the others.
  std::vector<float> got_c, want_c;
  bool nan_ok = true;
  for (size_t i = 0; i < n; i++) {
    if (std::isnan(want[i])) {
      nan_ok = nan_ok && std::isnan(got[i]);
      continue;
    }
    nan_ok = nan_ok && !std::isnan(got[i]);
    got_c.push_back(got[i]);
    want_c.push_back(want[i]);
  }
  check_close(ctx, std::string(what) + " out", got_c.data(), want_c.data(), got_c.size(),
              dt == DType::F32 ? 1e-5 : 1e-2);
  check_close(ctx, std::string(what) + " lse", finite_copy(got_lse).data(),
              finite_copy(want_lse).data(), nl, 1e-5);
  bool inf_same = true;
  for (size_t i = 0; i < nl; i++)
    inf_same = inf_same && ((got_lse[i] == -INFINITY) == (want_lse[i] == -INFINITY)) &&
               !std::isnan(got_lse[i]);
  expect(ctx, inf_same, std::string(what) + " -inf rows of lse, no NaN");
  expect(ctx, nan_ok, std::string(what) + " no NaN but on untouched empty rows");
  for (void* p : {d_out, d_out_b, d_lse, d_lse_b}) ops::release(p);
}

const Shape kShapes[] = {{1, 1, 1, 1}, {2, 5, 3, 7}, {3, 4, 5, 37}, {2, 64, 12, 64}};

}  // namespace

GPU_TEST(attention_merge) {
  for (DType dt : {DType::F32, DType::BF16})
    for (const Shape& s : kShapes) check_shape(ctx, s, dt);
}
