// model/fp8.cu - FP8 linear layers: the casts, the scales and the three GEMMs of a linear layer
// (the recipe and the why are in model/fp8.h; the kernels behind ops::fp8_* in kernels/*/fp8).
#include "model/fp8.h"

#include "kernels/fp8.h"

void fp8_create(Fp8Context& f, const Fp8Recipe& recipe, const std::vector<std::string>& names,
                int max_rows, int max_in, int max_out, Allocator& memory, ops::Stream s) {
  CHECK(recipe.history >= 1 && recipe.margin >= 0 && recipe.amax_group,
        "fp8: amax history %d, margin %d, amax group %p", recipe.history, recipe.margin,
        (void*)recipe.amax_group);
  f.recipe = recipe;
  f.names = names;
  auto scratch = [&](size_t bytes) { return allocate_zeroed(memory, bytes, s); };
  auto scaling = [&] { return Fp8Scaling{(float*)scratch((3 + recipe.history) * sizeof(float))}; };
  for (size_t i = 0; i < names.size(); i++)
    f.linears.push_back({scaling(), scaling(), scaling(), scaling(), scaling()});
  const size_t rows = max_rows, width = std::max(max_in, max_out);
  f.x8 = scratch(rows * width);
  f.x8t = scratch(rows * width);
  f.w8 = scratch((size_t)max_in * max_out);
  f.w8t = scratch((size_t)max_in * max_out);
  f.g8 = scratch(rows * width);
  f.g8t = scratch(rows * width);
}

// A new scale for x from its amax, agreed over the amax group (model/fp8.h).
static void rescale(const Fp8Context& f, const Fp8Scaling& sc, const void* x, size_t n,
                    DType fp8, ops::Stream s) {
  ops::amax(sc.amax(), x, n, DType::BF16, s);
  all_reduce_max(*f.recipe.amax_group, sc.amax(), 1, s);
  ops::fp8_update_scale(sc.scale(), sc.scale_inv(), sc.history(),
                        f.recipe.delayed ? f.recipe.history : 0, sc.amax(),
                        fp8_format(fp8).max_finite, f.recipe.margin, s);
}

void fp8_unobserved(const Fp8Context&, const Fp8Call&, void*) {}

// Tells the context's observer about a call, before and after it.
static void observe(const Fp8Context& f, Fp8Call call, bool after) {
  call.after = after;
  f.observer(f, call, f.observer_user);
}

void fp8_linear_forward(Fp8Context& f, int site, void* out, void* pre_gelu, const void* inp,
                        const void* weight, const void* bias, const void* residual, int N, int C,
                        int OC, ops::Stream s) {
  Fp8Call call;
  call.site = site, call.out = out, call.pre_gelu = pre_gelu, call.inp = inp;
  call.weight = weight, call.bias = bias, call.residual = residual;
  call.N = N, call.C = C, call.OC = OC, call.stream = s;
  observe(f, call, false);
  const Fp8Linear& L = f.linears[site];
  rescale(f, L.input, inp, (size_t)N * C, DType::E4M3, s);
  rescale(f, L.weight, weight, (size_t)OC * C, DType::E4M3, s);
  ops::fp8_cast(f.x8, nullptr, DType::E4M3, inp, DType::BF16, N, C, L.input.scale(), s);
  ops::fp8_cast(f.w8, nullptr, DType::E4M3, weight, DType::BF16, OC, C, L.weight.scale(), s);
  void* y = pre_gelu ? pre_gelu : out;
  ops::gemm_fp8(y, DType::BF16, false, f.x8, DType::E4M3, f.w8, DType::E4M3, N, OC, C,
                L.input.scale_inv(), L.weight.scale_inv(), s);
  ops::add_bias_residual(y, y, bias, residual, N, OC, DType::BF16, s);
  if (pre_gelu) ops::gelu_forward(out, pre_gelu, (size_t)N * OC, DType::BF16, s);
  observe(f, call, true);
}

void fp8_linear_backward(Fp8Context& f, int site, void* dinp, float* dweight, float* dbias,
                         const void* dout, const void* inp, const void* weight,
                         const void* gelu_input, int N, int C, int OC, ops::Stream s,
                         GradPart part) {
  Fp8Call call;
  call.site = site, call.backward = true, call.part = part, call.dinp = dinp;
  call.dweight = dweight, call.dbias = dbias, call.dout = dout, call.inp = inp;
  call.weight = weight, call.gelu_input = gelu_input, call.N = N, call.C = C, call.OC = OC;
  call.stream = s;
  observe(f, call, false);
  const Fp8Linear& L = f.linears[site];
  const bool input = part != GradPart::Weight, weights = part != GradPart::Input;
  // The weight pass alone scales the gradient with grad_w (model/fp8.h).
  const Fp8Scaling& grad = input ? L.grad : L.grad_w;
  rescale(f, grad, dout, (size_t)N * OC, DType::E5M2, s);
  if (weights) rescale(f, L.input_bwd, inp, (size_t)N * C, DType::E4M3, s);
  // g8 feeds the input gradient; the transposes (g8t, x8t, w8t) the rest: only what is needed.
  ops::fp8_cast(input && dinp ? f.g8 : nullptr, weights ? f.g8t : nullptr, DType::E5M2, dout,
                DType::BF16, N, OC, grad.scale(), s);
  if (weights)
    ops::fp8_cast(nullptr, f.x8t, DType::E4M3, inp, DType::BF16, N, C, L.input_bwd.scale(), s);
  if (input && dinp) {
    ops::fp8_cast(nullptr, f.w8t, DType::E4M3, weight, DType::BF16, OC, C, L.weight.scale(), s);
    ops::gemm_fp8(dinp, DType::BF16, false, f.g8, DType::E5M2, f.w8t, DType::E4M3, N, C, OC,
                  L.grad.scale_inv(), L.weight.scale_inv(), s);
    if (gelu_input) ops::gelu_backward(dinp, gelu_input, dinp, (size_t)N * C, DType::BF16, s);
  }
  if (weights)
    ops::gemm_fp8(dweight, DType::F32, true, f.g8t, DType::E5M2, f.x8t, DType::E4M3, OC, C, N,
                  grad.scale_inv(), L.input_bwd.scale_inv(), s);
  if (weights && dbias) ops::bias_backward(dbias, dout, N, OC, DType::BF16, s);
  observe(f, call, true);
}

std::vector<Fp8Snapshot> fp8_snapshot(const Fp8Context& f, const std::vector<int>& sites) {
  std::vector<Fp8Snapshot> out;
  for (int site : sites) {
    const Fp8Linear& L = f.linears[site];
    const std::pair<const char*, const Fp8Scaling*> parts[] = {
        {"input", &L.input}, {"weight", &L.weight}, {"grad", &L.grad}};
    for (const auto& p : parts) {
      float v[2];
      ops::copy_to_host(v, p.second->state, sizeof(v));
      out.push_back({f.names[site] + "/" + p.first, v[0], v[1]});
    }
  }
  return out;
}
