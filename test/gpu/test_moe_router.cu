// test/gpu/test_moe_router.cu - the mixture-of-experts router (CUDA, kernels/cuda/moe_router.cu)
// against the CPU oracle: moe_router_forward and moe_router_backward, the backward with the
// load-balancing gradient dprobs_aux and the z-loss on. dprobs_aux is made on the host from the
// oracle's expert choices by the formula of kernels/ops_decls.h (the one model/moe.cu's `balance`
// uses): dprobs_aux[t,e] = aux_coef * E * f_{s(t),e} / (T * B), f_{s,e} = slots of sequence s
// choosing e / (T * top_k); both backends get the same array.
//
// Shapes (B sequences of T tokens, E experts, top_k): one token of 3 experts, E = 8 and 13 on
// awkward T, E = 64 (two experts per lane) and E = 160 with top_k = 8 (five per lane, not a
// multiple of the warp). Logits are random with standard deviation 2; row 0 has an exact tie at
// the top (experts 0 and E-1 share the largest logit) and row 1 is all zeros (every expert ties:
// the choice must be experts 0, 1, ..., top_k-1). Outputs are poisoned with NaN (-1 for the int
// experts) before every call.
// Checks: experts exactly the oracle's (the choice is made on the logits, the same fp32 numbers
// on both sides, so there is no rounding to disagree on), gates, probs and lse at 1e-5 (expf vs
// the CPU's exp), dlogits at 1e-5 with the balance and z-loss terms on; and a second CUDA run
// gives the same bits (no atomics).
#include <cstring>

#include "test/gpu/harness.h"

namespace {

struct Shape {
  int B, T, E, top_k;
};

std::string label(const Shape& s, const char* what) {
  char buf[160];
  std::snprintf(buf, sizeof(buf), "moe_router B=%d T=%d E=%d top_k=%d %s", s.B, s.T, s.E,
                s.top_k, what);
  return buf;
}

// The router's outputs of one backend, on the host.
struct RouterOut {
  std::vector<int> expert;
  std::vector<float> gate, probs, lse, dlogits;
};

// The balance gradient (N,E) from the chosen experts (N,top_k) of B sequences of T tokens:
// aux_coef * E * f_{s,e} / (T * B), the same for every token of sequence s.
std::vector<float> balance_grad(const std::vector<int>& expert, const Shape& s, float aux_coef) {
  std::vector<float> d((size_t)s.B * s.T * s.E);
  std::vector<int> counts(s.E);
  for (int b = 0; b < s.B; b++) {
    std::fill(counts.begin(), counts.end(), 0);
    for (size_t i = (size_t)b * s.T * s.top_k; i < (size_t)(b + 1) * s.T * s.top_k; i++)
      counts[expert[i]]++;
    for (int t = 0; t < s.T; t++)
      for (int e = 0; e < s.E; e++) {
        const double f = (double)counts[e] / ((double)s.T * s.top_k);
        d[((size_t)b * s.T + t) * s.E + e] =
            (float)(aux_coef * (double)s.E * f / ((double)s.T * s.B));
      }
  }
  return d;
}

void* device_ints(size_t n) {
  void* p = ops::alloc(n * sizeof(int));
  poison(p, n * sizeof(int));
  return p;
}

// Everything on the GPU: forward, backward (dprobs_aux given, from the host).
RouterOut run_cuda(TestContext& ctx, const Shape& s, const std::vector<float>& z,
                   const std::vector<float>& dgate, const std::vector<float>& dprobs_aux,
                   float z_coef) {
  const size_t N = (size_t)s.B * s.T, NE = N * s.E, NK = N * s.top_k;
  void* d_z = to_device(z, DType::F32);
  void* d_dgate = to_device(dgate, DType::F32);
  void* d_dprobs_aux = to_device(dprobs_aux, DType::F32);
  void* d_expert = device_ints(NK);
  float* d[3];  // gate, probs, lse
  const size_t sizes[3] = {NK, NE, N};
  for (int i = 0; i < 3; i++) {
    d[i] = (float*)ops::alloc(sizes[i] * sizeof(float));
    poison(d[i], sizes[i] * sizeof(float));
  }
  float* d_dz = (float*)ops::alloc(NE * sizeof(float));
  poison(d_dz, NE * sizeof(float));
  ops::moe_router_forward((const float*)d_z, (int)N, s.E, s.top_k, (int*)d_expert, d[0], d[1],
                          d[2], ctx.stream);
  ops::moe_router_backward(d_dz, d[1], (const int*)d_expert, d[0], (const float*)d_dgate,
                           (const float*)d_dprobs_aux, d[2], z_coef, (int)N, s.E, s.top_k,
                           ctx.stream);
  RouterOut r;
  r.expert.resize(NK);
  ops::copy_to_host(r.expert.data(), d_expert, NK * sizeof(int));
  r.gate = to_host(d[0], NK, DType::F32);
  r.probs = to_host(d[1], NE, DType::F32);
  r.lse = to_host(d[2], N, DType::F32);
  r.dlogits = to_host(d_dz, NE, DType::F32);
  for (void* p : {d_z, d_dgate, d_dprobs_aux, d_expert, (void*)d_dz}) ops::release(p);
  for (float* p : d) ops::release(p);
  return r;
}

// The same on the CPU oracle; its expert choices give dprobs_aux (returned through *dprobs_aux),
// which the oracle's backward uses and the CUDA run is given.
RouterOut run_ref(TestContext& ctx, const Shape& s, const std::vector<float>& z,
                  const std::vector<float>& dgate, float aux_coef, float z_coef,
                  std::vector<float>* dprobs_aux) {
  const size_t N = (size_t)s.B * s.T, NE = N * s.E, NK = N * s.top_k;
  RouterOut r;
  r.expert.assign(NK, -1);
  r.gate.assign(NK, NAN);
  r.probs.assign(NE, NAN);
  r.lse.assign(N, NAN);
  r.dlogits.assign(NE, NAN);
  ref::moe_router_forward(z.data(), (int)N, s.E, s.top_k, r.expert.data(), r.gate.data(),
                          r.probs.data(), r.lse.data(), ctx.ref_stream);
  *dprobs_aux = balance_grad(r.expert, s, aux_coef);
  ref::moe_router_backward(r.dlogits.data(), r.probs.data(), r.expert.data(), r.gate.data(),
                           dgate.data(), dprobs_aux->data(), r.lse.data(), z_coef, (int)N, s.E,
                           s.top_k, ctx.ref_stream);
  return r;
}

bool same_bits_all(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

void check_shape(TestContext& ctx, const Shape& s) {
  const size_t N = (size_t)s.B * s.T, NE = N * s.E;
  std::vector<float> z = random_vector(ctx, NE, 2.0f);
  float top = z[0];
  for (int e = 0; e < s.E; e++) top = std::max(top, z[e]);
  z[0] = z[s.E - 1] = top + 1.0f;                         // row 0: a tie of two at the top
  if (N > 1) std::fill(z.begin() + s.E, z.begin() + 2 * s.E, 0.0f);  // row 1: all tie
  const std::vector<float> dgate = random_vector(ctx, N * s.top_k);
  const float aux_coef = 0.5f, z_coef = 0.1f / (float)N;
  std::vector<float> dprobs_aux;
  const RouterOut want = run_ref(ctx, s, z, dgate, aux_coef, z_coef, &dprobs_aux);
  const RouterOut got = run_cuda(ctx, s, z, dgate, dprobs_aux, z_coef);

  expect(ctx, got.expert == want.expert, label(s, "experts equal the oracle's"));
  bool rows_ok = want.expert[0] == 0 && (s.top_k < 2 || want.expert[1] == s.E - 1);
  for (int j = 0; N > 1 && j < s.top_k; j++) rows_ok = rows_ok && want.expert[s.top_k + j] == j;
  expect(ctx, rows_ok, label(s, "ties go to the lower index (oracle)"));
  check_close(ctx, label(s, "gate"), got.gate.data(), want.gate.data(), got.gate.size(), 1e-5);
  check_close(ctx, label(s, "probs"), got.probs.data(), want.probs.data(), NE, 1e-5);
  check_close(ctx, label(s, "lse"), got.lse.data(), want.lse.data(), N, 1e-5);
  check_close(ctx, label(s, "dlogits"), got.dlogits.data(), want.dlogits.data(), NE, 1e-5);

  const RouterOut again = run_cuda(ctx, s, z, dgate, dprobs_aux, z_coef);
  expect(ctx,
         again.expert == got.expert && same_bits_all(again.gate, got.gate) &&
             same_bits_all(again.probs, got.probs) && same_bits_all(again.lse, got.lse) &&
             same_bits_all(again.dlogits, got.dlogits),
         label(s, "a second run gives the same bits"));
}

const Shape kShapes[] = {{1, 1, 3, 1}, {3, 13, 8, 2}, {2, 37, 13, 3}, {4, 256, 64, 2},
                         {2, 64, 160, 8}};

}  // namespace

GPU_TEST(moe_router) {
  for (const Shape& s : kShapes) check_shape(ctx, s);
}
