// kernels/cuda/grouped_matmul.cu - grouped linear layers (ops::grouped_matmul_forward,
// ops::grouped_matmul_backward): a rank's experts, each a linear layer with its own weights over
// its own block of consecutive rows of one activation, all groups of a GEMM in one launch.
//
// Groups. Group g owns rows[g] rows (0 allowed) from first[g] = rows[0] + ... + rows[g-1], and
// the weight W_g (OC,C) at weight + g*OC*C. Per group the math of ops::matmul_* (row-major):
//
//   forward  y_g (n_g,OC) = x_g (n_g,C) . W_g^T     then + b_g, and GELU (pre_gelu = y)
//   dinp     dx_g (n_g,C) = dy_g (n_g,OC) . W_g      times gelu'(gelu_input) when given
//   dweight  dW_g (OC,C) += dy_g^T . x_g             fp32; dbias_g += column sums of dy_g
//
// One tile kernel serves all three: D (M x N) = A (M x K) . B (K x N) with each operand read
// through two element strides, so A = x, dy or dy^T and B = W^T, W or x are the same tensors
// without copies. A block computes one 64 x 64 tile of D: 256 threads, each 4 x 4 sums in
// registers (rows ty + 16 r, columns tx + 16 c), over k in slices of 16 staged in shared memory
// as fp32. Slices are loaded along the operand's unit-stride dimension, so a warp reads
// consecutive addresses, with 16-byte loads when that dimension's stride and the base allow it.
//
// The grid. Forward and dinp tile the rows of every group: grid.y = the groups' row tiles
// together (sum of ceil(n_g / 64)), grid.x = column tiles; a block finds its group in the row-tile
// table. dweight's sum runs over a group's rows: grid.z = the group, grid.y x grid.x = OC x C
// tiles. The row counts travel as the kernel's argument (GroupTable, by value): they are on the
// host already (the dispatch plan is made there, model/moe.cu), so nothing is copied and the host
// never waits; no count is read back.
//
// Numbers. Every sum runs over k in order in fp32 (fmaf), the epilogue works on the fp32 sums and
// rounds each stored value once: bias add, GELU (pre_gelu stored, then gelu of the fp32 value),
// dGELU, dW += sums. That is the CPU backend's contract (kernels/cpu/matmul.cpp); the results
// differ from it and from cuBLASLt only in the order of the fp32 sums. The bias gradient: one
// thread per column sums the group's rows in order, in double, and adds once.
//
// Why our own kernel. The installed cuBLASLt (13.1) has no grouped matmul. cuBLAS's
// cublasGemmGroupedBatchedEx takes host size arrays (ours are on the host), but has no
// epilogues (bias, GELU, dGELU, bias gradient), and we did not find a bf16 x bf16 -> fp32 C
// combination documented for it, which the weight gradient (accumulated into the fp32
// gradient) needs. The price: this kernel uses the CUDA cores' fp32 FMA, not the tensor cores,
// so an expert GEMM large enough to fill the GPU runs slower here than in cuBLASLt; the grouped
// launch wins where experts are many and small (fine-grained MoE), where a loop of GEMMs is
// bound by launches and tails. Bytes: each operand element is read ceil(other dim / 64) times.
//
// Which path. Where the experts are large the op runs them as a loop of cuBLASLt GEMMs (the
// matmul_* ops, on the tensor cores) instead: when the average non-empty group's GEMM is at least
// kLoopFlops (1.5e8). The estimate behind it, to be measured on a GPU: fp32 FMA at ~30 TFLOP/s
// here against ~600 on the tensor cores, a GEMM launch and its tail ~5 us, so the one launch wins
// below ~5 us x 30 TFLOP/s = 1.5e8 FLOPs per group. The two paths differ only in the order of the
// fp32 sums (test/gpu/test_grouped_matmul.cu runs both).
#include <algorithm>

#include "kernels/cuda/cuda_common.cuh"

namespace ops {
namespace {

constexpr int kTile = 64;       // a block's tile of D: kTile x kTile
constexpr int kSlice = 16;      // k per shared-memory stage
constexpr int kSide = 16;       // threads per side: kSide x kSide, 4 x 4 sums each
constexpr int kThreads = kSide * kSide;
constexpr int kPer = kTile / kSide;
constexpr int kMaxGroups = 256;  // [model] n_experts' limit: every expert on one rank

// The groups' rows, by value: first row and first row tile of each group (both with a final
// entry, the totals).
struct GroupTable {
  int groups;
  int first[kMaxGroups + 1];
  int tile_first[kMaxGroups + 1];
};

// One operand: element (x, k) at p[x * sx + k * sk], for x < nx (rows of A, columns of B).
template <typename T>
struct Operand {
  const T* p;
  size_t sx, sk;
  int nx;
};

// Loads the slice k0 .. k0 + kSlice of x0 .. x0 + kTile into s[k][x] (zeros outside the operand,
// K columns). W: elements per load along the unit-stride dimension (a 16-byte pack, or 1).
template <int W, typename T>
__device__ __forceinline__ void load_slice(float (*s)[kTile + 1], const Operand<T>& o, int x0,
                                           int k0, int K) {
  const bool k_unit = o.sk == 1;
  const int along = k_unit ? kSlice : kTile;  // the unit-stride dimension's length in the slice
  for (int unit = threadIdx.x; unit < kTile * kSlice / W; unit += kThreads) {
    const int u = unit * W % along, v = unit * W / along;
    const int x = k_unit ? v : u, k = k_unit ? u : v;
    const int x_end = min(o.nx - x0 - x, k_unit ? 1 : W), k_end = min(K - k0 - k, k_unit ? W : 1);
    float f[W];
    if (W > 1 && x_end == (k_unit ? 1 : W) && k_end == (k_unit ? W : 1)) {
      load_floats<W>(f, o.p + (size_t)(x0 + x) * o.sx + (size_t)(k0 + k) * o.sk);
    } else {
#pragma unroll
      for (int j = 0; j < W; j++) {
        const int xj = x + (k_unit ? 0 : j), kj = k + (k_unit ? j : 0);
        const bool in = x0 + xj < o.nx && k0 + kj < K;
        f[j] = in ? to_float(o.p[(size_t)(x0 + xj) * o.sx + (size_t)(k0 + kj) * o.sk]) : 0.0f;
      }
    }
#pragma unroll
    for (int j = 0; j < W; j++) s[k + (k_unit ? j : 0)][x + (k_unit ? 0 : j)] = f[j];
  }
}

// acc[r][c] = sum over k < K of A(i0 + ty + 16 r, k) B(k, j0 + tx + 16 c), in order of k.
template <int W, typename T>
__device__ __forceinline__ void tile_sums(float (&acc)[kPer][kPer], float (*sa)[kTile + 1],
                                          float (*sb)[kTile + 1], const Operand<T>& a, int i0,
                                          const Operand<T>& b, int j0, int K) {
  const int tx = threadIdx.x % kSide, ty = threadIdx.x / kSide;
#pragma unroll
  for (int r = 0; r < kPer; r++)
#pragma unroll
    for (int c = 0; c < kPer; c++) acc[r][c] = 0.0f;
  for (int k0 = 0; k0 < K; k0 += kSlice) {
    load_slice<W>(sa, a, i0, k0, K);
    load_slice<W>(sb, b, j0, k0, K);
    __syncthreads();
#pragma unroll 4
    for (int k = 0; k < kSlice; k++) {
      float av[kPer], bv[kPer];
#pragma unroll
      for (int r = 0; r < kPer; r++) av[r] = sa[k][ty + kSide * r];
#pragma unroll
      for (int c = 0; c < kPer; c++) bv[c] = sb[k][tx + kSide * c];
#pragma unroll
      for (int r = 0; r < kPer; r++)
#pragma unroll
        for (int c = 0; c < kPer; c++) acc[r][c] = fmaf(av[r], bv[c], acc[r][c]);
    }
    __syncthreads();
  }
}

// The group of row tile t: the last g whose first tile is <= t (empty groups own no tile).
__device__ __forceinline__ int group_of_tile(const GroupTable& table, int t) {
  int lo = 0, hi = table.groups - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (table.tile_first[mid] <= t) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

// Forward (kInputGrad false): out = x_g W_g^T + b_g [pre_gelu, GELU]. Input gradient (true):
// out = dy_g W_g [* gelu'(aux)]. in: x or dy (rows x K); aux: gelu_input. N: out's columns.
template <int W, bool kInputGrad, typename T>
__global__ void __launch_bounds__(kThreads)
    grouped_rows_kernel(T* out, T* pre_gelu, const T* in, const T* weight, const T* bias,
                        const T* aux, const GroupTable table, int N, int K) {
  __shared__ float sa[kSlice][kTile + 1], sb[kSlice][kTile + 1];
  const int g = group_of_tile(table, blockIdx.y);
  const int row0 = table.first[g], rows = table.first[g + 1] - row0;
  const int i0 = (blockIdx.y - table.tile_first[g]) * kTile, j0 = blockIdx.x * kTile;
  const T* w = weight + (size_t)g * N * K;
  const Operand<T> a{in + (size_t)row0 * K, (size_t)K, 1, rows};
  // B (k, j): forward W_g^T, W_g (N,K) holds (j, k); input gradient W_g (K,N) holds (k, j).
  const Operand<T> b = kInputGrad ? Operand<T>{w, 1, (size_t)N, N}
                                  : Operand<T>{w, (size_t)K, 1, N};
  float acc[kPer][kPer];
  tile_sums<W>(acc, sa, sb, a, i0, b, j0, K);
  const int tx = threadIdx.x % kSide, ty = threadIdx.x / kSide;
#pragma unroll
  for (int r = 0; r < kPer; r++) {
    const int i = i0 + ty + kSide * r;
    if (i >= rows) continue;
    const size_t base = (size_t)(row0 + i) * N;
#pragma unroll
    for (int c = 0; c < kPer; c++) {
      const int j = j0 + tx + kSide * c;
      if (j >= N) continue;
      float y = acc[r][c];
      if (kInputGrad) {
        if (aux) y *= gelu_grad(to_float(aux[base + j]));
      } else {
        if (bias) y += to_float(bias[(size_t)g * N + j]);
        if (pre_gelu) {
          pre_gelu[base + j] = from_float<T>(y);
          y = gelu(y);
        }
      }
      out[base + j] = from_float<T>(y);
    }
  }
}

// dW_g (OC,C) += dy_g^T x_g over the group's rows; grid.z = g.
template <int W, typename T>
__global__ void __launch_bounds__(kThreads)
    grouped_weight_grad_kernel(float* dweight, const T* dout, const T* inp,
                               const GroupTable table, int C, int OC) {
  __shared__ float sa[kSlice][kTile + 1], sb[kSlice][kTile + 1];
  const int g = blockIdx.z, row0 = table.first[g], rows = table.first[g + 1] - row0;
  if (rows == 0) return;
  const int i0 = blockIdx.y * kTile, j0 = blockIdx.x * kTile;
  const Operand<T> a{dout + (size_t)row0 * OC, 1, (size_t)OC, OC};  // dy^T (o, k = row)
  const Operand<T> b{inp + (size_t)row0 * C, 1, (size_t)C, C};     // x (k = row, c)
  float acc[kPer][kPer];
  tile_sums<W>(acc, sa, sb, a, i0, b, j0, rows);
  const int tx = threadIdx.x % kSide, ty = threadIdx.x / kSide;
  float* dw = dweight + (size_t)g * OC * C;
#pragma unroll
  for (int r = 0; r < kPer; r++) {
    const int o = i0 + ty + kSide * r;
#pragma unroll
    for (int c = 0; c < kPer; c++) {
      const int j = j0 + tx + kSide * c;
      if (o < OC && j < C) dw[(size_t)o * C + j] += acc[r][c];
    }
  }
}

// dbias_g[o] += sum over the group's rows of dy[row, o] (double, in row order); grid.y = g.
template <typename T>
__global__ void grouped_bias_grad_kernel(float* dbias, const T* dout, const GroupTable table,
                                         int OC) {
  const int g = blockIdx.y, o = blockIdx.x * blockDim.x + threadIdx.x;
  if (o >= OC) return;
  double sum = 0;
  for (int row = table.first[g]; row < table.first[g + 1]; row++)
    sum += to_float(dout[(size_t)row * OC + o]);
  dbias[(size_t)g * OC + o] += (float)sum;
}

GroupTable group_table(const int* rows, int groups) {
  CHECK(groups >= 1 && groups <= kMaxGroups, "grouped_matmul: %d groups (1 to %d)", groups,
        kMaxGroups);
  GroupTable t;
  t.groups = groups;
  t.first[0] = t.tile_first[0] = 0;
  for (int g = 0; g < groups; g++) {
    CHECK(rows[g] >= 0, "grouped_matmul: group %d has %d rows", g, rows[g]);
    t.first[g + 1] = t.first[g] + rows[g];
    t.tile_first[g + 1] = t.tile_first[g] + (int)ceil_div(rows[g], kTile);
  }
  return t;
}

// 16-byte slices when every operand's rows start 16-byte aligned.
bool vector_loads(DType dt, std::initializer_list<int> widths,
                  std::initializer_list<const void*> bases) {
  const int pack = 16 / (int)dtype_size(dt);
  for (int w : widths)
    if (w % pack != 0) return false;
  return aligned16(bases);
}

template <typename T, int W, bool kInputGrad>
void launch_rows(void* out, void* pre_gelu, const void* in, const void* weight, const void* bias,
                 const void* aux, const GroupTable& t, int N, int K, Stream s) {
  const dim3 grid((unsigned)ceil_div(N, kTile), (unsigned)t.tile_first[t.groups]);
  grouped_rows_kernel<W, kInputGrad, T><<<grid, kThreads, 0, s->stream>>>(
      (T*)out, (T*)pre_gelu, (const T*)in, (const T*)weight, (const T*)bias, (const T*)aux, t, N,
      K);
  LAUNCH_CHECK();
}

// out (rows, N) = in (rows, K) times each group's weight (forward or input gradient).
template <bool kInputGrad>
void rows_gemm(void* out, void* pre_gelu, const void* in, const void* weight, const void* bias,
               const void* aux, const GroupTable& t, int N, int K, DType dt, Stream s) {
  if (t.tile_first[t.groups] == 0) return;
  const bool vec = vector_loads(dt, {N, K}, {in, weight});
  dispatch_dtype(dt, [&](auto tag) {
    using T = decltype(tag);
    constexpr int P = Pack128<T>::size;
    if (vec) launch_rows<T, P, kInputGrad>(out, pre_gelu, in, weight, bias, aux, t, N, K, s);
    else launch_rows<T, 1, kInputGrad>(out, pre_gelu, in, weight, bias, aux, t, N, K, s);
  });
}

void weight_and_bias_grads(float* dweight, float* dbias, const void* dout, const void* inp,
                           const GroupTable& t, int C, int OC, DType dt, Stream s) {
  if (t.first[t.groups] == 0) return;
  const bool vec = vector_loads(dt, {C, OC}, {dout, inp});
  dispatch_dtype(dt, [&](auto tag) {
    using T = decltype(tag);
    constexpr int P = Pack128<T>::size;
    if (dweight) {
      const dim3 grid((unsigned)ceil_div(C, kTile), (unsigned)ceil_div(OC, kTile),
                      (unsigned)t.groups);
      auto kernel = vec ? grouped_weight_grad_kernel<P, T> : grouped_weight_grad_kernel<1, T>;
      kernel<<<grid, kThreads, 0, s->stream>>>(dweight, (const T*)dout, (const T*)inp, t, C, OC);
      LAUNCH_CHECK();
    }
    if (dbias) {
      const dim3 grid((unsigned)ceil_div(OC, 128), (unsigned)t.groups);
      grouped_bias_grad_kernel<T><<<grid, 128, 0, s->stream>>>(dbias, (const T*)dout, t, OC);
      LAUNCH_CHECK();
    }
  });
}

// The loop of cuBLASLt GEMMs pays where the average non-empty group does kLoopFlops or more.
constexpr double kLoopFlops = 1.5e8;

bool loop_of_gemms(const int* rows, int groups, int C, int OC) {
  long long total = 0;
  int busy = 0;
  for (int g = 0; g < groups; g++) {
    total += rows[g];
    busy += rows[g] > 0;
  }
  return busy > 0 && 2.0 * (double)total / busy * C * OC >= kLoopFlops;
}

const void* at(const void* base, size_t elems, DType dt) {
  return base ? (const char*)base + elems * dtype_size(dt) : nullptr;
}
void* at(void* base, size_t elems, DType dt) {
  return base ? (char*)base + elems * dtype_size(dt) : nullptr;
}
float* at(float* base, size_t elems) { return base ? base + elems : nullptr; }

}  // namespace

void grouped_matmul_forward(void* out, void* pre_gelu, const void* inp, const void* weight,
                            const void* bias, const int* rows, int groups, int C, int OC,
                            DType dt, Stream s) {
  OP_SPAN(grouped_matmul_forward);
  if (is_dry(s)) return;
  CHECK(C > 0 && OC > 0, "grouped_matmul_forward: bad shape C=%d OC=%d", C, OC);
  const GroupTable t = group_table(rows, groups);
  if (loop_of_gemms(rows, groups, C, OC)) {
    for (int g = 0; g < groups; g++) {
      if (rows[g] == 0) continue;
      const size_t row = t.first[g];
      matmul_forward(at(out, row * OC, dt), at(pre_gelu, row * OC, dt), at(inp, row * C, dt),
                     at(weight, (size_t)g * OC * C, dt), at(bias, (size_t)g * OC, dt), nullptr,
                     rows[g], C, OC, dt, s);
    }
    return;
  }
  rows_gemm<false>(out, pre_gelu, inp, weight, bias, nullptr, t, OC, C, dt, s);
}

void grouped_matmul_backward(void* dinp, float* dweight, float* dbias, const void* dout,
                             const void* inp, const void* weight, const void* gelu_input,
                             const int* rows, int groups, int C, int OC, DType dt, Stream s) {
  OP_SPAN(grouped_matmul_backward);
  if (is_dry(s)) return;
  CHECK(C > 0 && OC > 0, "grouped_matmul_backward: bad shape C=%d OC=%d", C, OC);
  const GroupTable t = group_table(rows, groups);
  if (loop_of_gemms(rows, groups, C, OC)) {
    for (int g = 0; g < groups; g++) {
      if (rows[g] == 0) continue;
      const size_t row = t.first[g];
      matmul_backward(at(dinp, row * C, dt), at(dweight, (size_t)g * OC * C),
                      at(dbias, (size_t)g * OC), at(dout, row * OC, dt), at(inp, row * C, dt),
                      at(weight, (size_t)g * OC * C, dt), at(gelu_input, row * C, dt), rows[g],
                      C, OC, dt, s);
    }
    return;
  }
  if (dinp) rows_gemm<true>(dinp, nullptr, dout, weight, nullptr, gelu_input, t, C, OC, dt, s);
  weight_and_bias_grads(dweight, dbias, dout, inp, t, C, OC, dt, s);
}

}  // namespace ops
