// model/fp8.cu - FP8 linear layers: the casts, the scales and the three GEMMs of a linear layer
// (the recipe and the why are in model/fp8.h; the kernels behind ops::fp8_* in kernels/*/fp8).
#include "model/fp8.h"

#include "kernels/fp8.h"

Fp8Granularity fp8_granularity(const std::string& recipe) {
  if (recipe == "rowwise") return Fp8Granularity::Row;
  if (recipe == "blockwise") return Fp8Granularity::Block;
  if (recipe == "mxfp8") return Fp8Granularity::Mx;
  CHECK(recipe == "tensorwise" || recipe == "delayed", "fp8_recipe \"%s\": not a recipe",
        recipe.c_str());
  return Fp8Granularity::Tensor;
}

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
  if (recipe.granularity == Fp8Granularity::Tensor) return;
  // Scales: a matrix of e elements whose longer side is `side` has at most e/32 + side blocks
  // (blocks of at least 32 elements along a row, or 128 x 128).
  auto scales = [&](size_t elements, size_t side) {
    return (float*)scratch((elements / 32 + side + 1) * sizeof(float));
  };
  const size_t side = std::max(rows, width), wside = std::max(max_in, max_out);
  f.x8_scale = scales(rows * width, side), f.x8t_scale = scales(rows * width, side);
  f.g8_scale = scales(rows * width, side), f.g8t_scale = scales(rows * width, side);
  f.w8_scale = scales((size_t)max_in * max_out, wside);
  f.w8t_scale = scales((size_t)max_in * max_out, wside);
  f.dequantized = scratch(2 * (rows + width) * side);  // bf16 (M + N) x K, any of the 3 GEMMs
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

// The scale block of an operand of the block recipes (model/fp8.h): operands are K-contiguous,
// rows x K, so a "row" is a run along the GEMM's reduction dimension.
struct ScaleBlock {
  int rows, cols;
};
static ScaleBlock scale_block(const Fp8Recipe& r, bool weight, int K) {
  switch (r.granularity) {
    case Fp8Granularity::Row: return {1, K};
    case Fp8Granularity::Block: return weight ? ScaleBlock{128, 128} : ScaleBlock{1, 128};
    case Fp8Granularity::Mx: return {1, 32};
    default: break;
  }
  FATAL("fp8: scale_block of a per-tensor recipe");
}

// One operand of a block-scaled GEMM: codes (rows x K) and their scales.
struct BlockOperand {
  void* codes;
  float* scale_inv;
  DType fp8;
  ScaleBlock block;
};

// x (bf16, rows x cols), or x^T with transpose, cast into `into` with its own block scales for a
// GEMM that reduces over the logical matrix's columns.
static BlockOperand cast_blocks(const Fp8Context& f, void* codes, float* scale_inv, DType fp8,
                                const void* x, int rows, int cols, bool transpose, bool weight,
                                ops::Stream s) {
  const ScaleBlock b = scale_block(f.recipe, weight, transpose ? rows : cols);
  ops::fp8_cast_blocks(codes, scale_inv, fp8, x, DType::BF16, rows, cols, transpose, b.rows,
                       b.cols, f.recipe.granularity == Fp8Granularity::Mx, f.recipe.margin, s);
  return {codes, scale_inv, fp8, b};
}

static void gemm_blocks(const Fp8Context& f, void* out, DType out_dt, bool accumulate,
                        const BlockOperand& a, const BlockOperand& b, int M, int N, int K,
                        ops::Stream s) {
  ops::gemm_fp8_blocks(out, out_dt, accumulate, a.codes, a.fp8, a.scale_inv, a.block.rows,
                       a.block.cols, b.codes, b.fp8, b.scale_inv, b.block.rows, b.block.cols, M, N,
                       K, f.dequantized, s);
}

// The forward of a block recipe: y (N,OC) = x (N,C) . w (OC,C)^T, both K-major already.
static void forward_blocks(Fp8Context& f, void* y, const void* inp, const void* weight, int N,
                           int C, int OC, ops::Stream s) {
  const BlockOperand x8 =
      cast_blocks(f, f.x8, f.x8_scale, DType::E4M3, inp, N, C, false, false, s);
  const BlockOperand w8 =
      cast_blocks(f, f.w8, f.w8_scale, DType::E4M3, weight, OC, C, false, true, s);
  gemm_blocks(f, y, DType::BF16, false, x8, w8, N, OC, C, s);
}

// The backward of a block recipe: each transposed operand cast from bf16 with blocks of its own
// layout (model/fp8.h), so no state carries from the forward.
static void backward_blocks(Fp8Context& f, void* dinp, float* dweight, const void* dout,
                            const void* inp, const void* weight, int N, int C, int OC,
                            bool input, bool weights, ops::Stream s) {
  if (input && dinp) {  // dinp (N,C) = g (N,OC) . (w^T (C,OC))^T
    const BlockOperand g8 =
        cast_blocks(f, f.g8, f.g8_scale, DType::E5M2, dout, N, OC, false, false, s);
    const BlockOperand w8t =
        cast_blocks(f, f.w8t, f.w8t_scale, DType::E4M3, weight, OC, C, true, true, s);
    gemm_blocks(f, dinp, DType::BF16, false, g8, w8t, N, C, OC, s);
  }
  if (weights) {  // dW (OC,C) += g^T (OC,N) . (x^T (C,N))^T
    const BlockOperand g8t =
        cast_blocks(f, f.g8t, f.g8t_scale, DType::E5M2, dout, N, OC, true, false, s);
    const BlockOperand x8t =
        cast_blocks(f, f.x8t, f.x8t_scale, DType::E4M3, inp, N, C, true, false, s);
    gemm_blocks(f, dweight, DType::F32, true, g8t, x8t, OC, C, N, s);
  }
}

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
  if (f.recipe.granularity != Fp8Granularity::Tensor) {
    void* y = pre_gelu ? pre_gelu : out;
    forward_blocks(f, y, inp, weight, N, C, OC, s);
    ops::add_bias_residual(y, y, bias, residual, N, OC, DType::BF16, s);
    if (pre_gelu) ops::gelu_forward(out, pre_gelu, (size_t)N * OC, DType::BF16, s);
    observe(f, call, true);
    return;
  }
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
  const bool input = part != GradPart::Weight, weights = part != GradPart::Input;
  if (f.recipe.granularity != Fp8Granularity::Tensor) {
    backward_blocks(f, dinp, dweight, dout, inp, weight, N, C, OC, input, weights, s);
    if (input && dinp && gelu_input)
      ops::gelu_backward(dinp, gelu_input, dinp, (size_t)N * C, DType::BF16, s);
    if (weights && dbias) ops::bias_backward(dbias, dout, N, OC, DType::BF16, s);
    observe(f, call, true);
    return;
  }
  const Fp8Linear& L = f.linears[site];
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
  if (f.recipe.granularity != Fp8Granularity::Tensor) return out;  // no per-tensor scales
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
