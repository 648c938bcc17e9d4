// kernels/cuda/attention_cudnn.cu - causal attention through cuDNN's fused flash-attention engine,
// driven by the cuDNN graph ("backend") API in plain C, without the cudnn_frontend headers.
//
// What it computes: the same as the hand-written kernels (see ops_decls.h) - out and the row
// log-sum-exp lse from packed qkv, and dqkv from dout. cuDNN has no single "causal attention"
// call in this version (9.19): its native SDPA operation has no causal mask. Instead one describes
// attention as a small graph of matmuls, pointwise ops and reductions, and cuDNN's runtime-fusion
// engine recognises the pattern and compiles it into one flash-attention kernel. The forward graph
// (virtual tensors are never stored; only Q, K, V, O and Stats touch memory):
//
//   S = Q @ K^T            (B,NH,T,T) fp32 virtual        Stats = M + log(Z)  -> lse (B,NH,T)
//   S = S * scale                                       P     = exp(S - M) / Z   (bf16 virtual)
//   S = row >= col ? S : -inf   (GEN_INDEX, CMP_GE,     O     = P @ V
//                                BINARY_SELECT)
//   M = rowmax(S), Z = rowsum(exp(S - M))
//
// The backward graph recomputes P from Q, K and Stats, exactly as the hand-written kernels do:
//
//   D  = rowsum(dO * O)           (B,NH,T,1) fp32, in workspace
//   P  = exp(mask(Q @ K^T * scale) - Stats)
//   dV = P^T @ dO,   dP = dO @ V^T,   dS = P * (dP - D) * scale
//   dK = dS^T @ Q,   dQ = dS @ K      (dQ accumulates in fp32 workspace, then is cast to bf16)
//
// Strides do the layout work: Q, K and V are read straight out of the packed (B,T,3C) qkv buffer
// (head h of q at column h*HS, of k at C + h*HS, of v at 2C + h*HS), K^T by swapping two strides,
// and dq, dk, dv are written straight into their columns of dqkv. No transposes, no copies.
//
// Cost of the API: building a graph and finding an engine takes tens of milliseconds, so plans
// are built once per (direction, shape) and cached on the stream; a call then only assembles a
// variant pack (the pointers) and executes. If no engine accepts the graph (an older GPU, an
// unsupported head size), forward/backward return false with cuDNN's message and the caller falls
// back to the hand-written kernels. Without a GPU, test/test_cudnn_graph.cu asks cuDNN's own
// heuristics (engines_for_described_device) whether its engines take these graphs on an H100 and
// an H200; cuDNN older than that test's version, and a one-token backward, are not asked at all.
#include <cudnn.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

#include "kernels/cuda/attention_cudnn.cuh"

namespace ops {
namespace cudnn_sdpa {
namespace {

#define CUDNN_CHECK(call)                                                                      \
  do {                                                                                         \
    cudnnStatus_t st_ = (call);                                                                \
    if (st_ != CUDNN_STATUS_SUCCESS) fatal_error(__FILE__, __LINE__, "cuDNN: %s (%s)",        \
                                                 cudnnGetErrorString(st_), last_error().c_str()); \
  } while (0)

std::string last_error() {
  char message[1024] = {0};
  cudnnGetLastErrorString(message, sizeof(message));
  return message;
}

// A tensor of the graph: its descriptor and the unique id by which the variant pack names it.
struct Tensor {
  cudnnBackendDescriptor_t desc = nullptr;
  int64_t uid = 0;
};
using Dims = std::vector<int64_t>;

// What an execution plan is built for: the device of a live cuDNN handle or, with no GPU at all,
// a device described by a cuDNN device-properties descriptor (cuDNN >= 9.8 accepts one in place
// of the handle for its heuristics; test/test_cudnn_graph.cu uses that).
struct PlanTarget {
  cudnnHandle_t handle = nullptr;
  cudnnBackendDescriptor_t device = nullptr;
};

// Builds one operation graph and its execution plan. Every descriptor it creates is owned here
// (the plan is only valid while they live). The first failing cuDNN call is remembered in
// `error` and makes every later call a no-op, so the graph code below reads as straight-line
// dataflow without a status check on every line.
struct GraphBuilder {
  std::vector<cudnnBackendDescriptor_t> owned;
  std::vector<cudnnBackendDescriptor_t> operations;
  int64_t next_uid = 1;
  std::string error;

  bool ok() const { return error.empty(); }
  void check(cudnnStatus_t st, const char* what) {
    if (st != CUDNN_STATUS_SUCCESS && ok())
      error = std::string(what) + ": " + cudnnGetErrorString(st) + " " + last_error();
  }
  cudnnBackendDescriptor_t create(cudnnBackendDescriptorType_t type) {
    cudnnBackendDescriptor_t d = nullptr;
    if (!ok()) return nullptr;
    check(cudnnBackendCreateDescriptor(type, &d), "create descriptor");
    if (d) owned.push_back(d);
    return d;
  }
  void set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
           cudnnBackendAttributeType_t type, int64_t count, const void* value) {
    if (ok()) check(cudnnBackendSetAttribute(d, name, type, count, value), "set attribute");
  }
  void set_desc(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                cudnnBackendDescriptor_t value) {
    set(d, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &value);
  }
  void finalize(cudnnBackendDescriptor_t d, const char* what) {
    if (ok()) check(cudnnBackendFinalize(d), what);
  }

  enum class Kind { Virtual, Memory, ByValue };
  Tensor tensor(const Dims& dims, const Dims& strides, cudnnDataType_t type, Kind kind) {
    Tensor t;
    t.uid = next_uid++;
    t.desc = create(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    const int64_t alignment = 16;
    const bool is_virtual = kind == Kind::Virtual, by_value = kind == Kind::ByValue;
    set(t.desc, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type);
    set(t.desc, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, (int64_t)dims.size(), dims.data());
    set(t.desc, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, (int64_t)strides.size(),
        strides.data());
    set(t.desc, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &t.uid);
    set(t.desc, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment);
    set(t.desc, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual);
    if (by_value) set(t.desc, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value);
    finalize(t.desc, "tensor");
    return t;
  }
  // A virtual tensor: an intermediate result between fused operations, never stored.
  Tensor scratch(const Dims& dims, const Dims& strides, cudnnDataType_t type = CUDNN_DATA_FLOAT) {
    return tensor(dims, strides, type, Kind::Virtual);
  }
  Tensor scalar() {  // a float passed by value at execution time (a host pointer in the pack)
    return tensor({1, 1, 1, 1}, {1, 1, 1, 1}, CUDNN_DATA_FLOAT, Kind::ByValue);
  }

  // An operation node: a descriptor of `type` whose attributes point at other descriptors (its
  // settings descriptor and its tensors), finalized and appended to the graph.
  using Link = std::pair<cudnnBackendAttributeName_t, cudnnBackendDescriptor_t>;
  using Links = std::initializer_list<Link>;
  void add_operation(cudnnBackendDescriptorType_t type, Links links, const char* what) {
    cudnnBackendDescriptor_t op = create(type);
    for (const auto& link : links)
      if (link.second) set_desc(op, link.first, link.second);
    finalize(op, what);
    if (ok()) operations.push_back(op);
  }
  // y = mode(x, b, t); GEN_INDEX takes an axis, BINARY_SELECT a predicate t (y = t ? x : b).
  void pointwise(cudnnPointwiseMode_t mode, Tensor x, Tensor y, const Tensor* b = nullptr,
                 const Tensor* t = nullptr, cudnnDataType_t math = CUDNN_DATA_FLOAT,
                 int64_t axis = -1) {
    cudnnBackendDescriptor_t pw = create(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    set(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
    set(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &math);
    if (axis >= 0) set(pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
    finalize(pw, "pointwise descriptor");
    add_operation(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR,
                  {{CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw},
                   {CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x.desc},
                   {CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b ? b->desc : nullptr},
                   {CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t ? t->desc : nullptr},
                   {CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y.desc}},
                  "pointwise operation");
  }
  void binary(cudnnPointwiseMode_t mode, Tensor x, Tensor b, Tensor y) {
    pointwise(mode, x, y, &b);
  }

  // y = reduce(x) over the dimensions where y has extent 1.
  void reduction(cudnnReduceTensorOp_t mode, Tensor x, Tensor y) {
    cudnnBackendDescriptor_t red = create(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    cudnnDataType_t math = CUDNN_DATA_FLOAT;
    set(red, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode);
    set(red, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &math);
    finalize(red, "reduction descriptor");
    add_operation(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR,
                  {{CUDNN_ATTR_OPERATION_REDUCTION_DESC, red},
                   {CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x.desc},
                   {CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y.desc}},
                  "reduction operation");
  }

  // Batched c = a @ b over the two leading dimensions, fp32 accumulation.
  void matmul(Tensor a, Tensor b, Tensor c) {
    cudnnBackendDescriptor_t mm = create(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    cudnnDataType_t math = CUDNN_DATA_FLOAT;
    set(mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &math);
    finalize(mm, "matmul descriptor");
    add_operation(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR,
                  {{CUDNN_ATTR_OPERATION_MATMUL_DESC, mm},
                   {CUDNN_ATTR_OPERATION_MATMUL_ADESC, a.desc},
                   {CUDNN_ATTR_OPERATION_MATMUL_BDESC, b.desc},
                   {CUDNN_ATTR_OPERATION_MATMUL_CDESC, c.desc}},
                  "matmul operation");
  }

  // y is x seen through other dims/strides (a transpose of the last two axes here).
  void reshape(Tensor x, Tensor y) {
    add_operation(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR,
                  {{CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x.desc},
                   {CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y.desc}},
                  "reshape operation");
  }

  // The causal mask: s where row >= col, else -inf (after exp: 0).
  Tensor causal_mask(Tensor s, const Dims& dims, const Dims& strides, Tensor minus_infinity) {
    Tensor row = scratch(dims, strides, CUDNN_DATA_INT32);
    Tensor col = scratch(dims, strides, CUDNN_DATA_INT32);
    pointwise(CUDNN_POINTWISE_GEN_INDEX, s, row, nullptr, nullptr, CUDNN_DATA_INT32, 2);
    pointwise(CUDNN_POINTWISE_GEN_INDEX, s, col, nullptr, nullptr, CUDNN_DATA_INT32, 3);
    Tensor keep = scratch(dims, strides, CUDNN_DATA_BOOLEAN);
    pointwise(CUDNN_POINTWISE_CMP_GE, row, keep, &col, nullptr, CUDNN_DATA_BOOLEAN);
    Tensor masked = scratch(dims, strides);
    pointwise(CUDNN_POINTWISE_BINARY_SELECT, s, masked, &minus_infinity, &keep);
    return masked;
  }

  // The operation graph, finalized.
  cudnnBackendDescriptor_t operation_graph(const PlanTarget& target) {
    cudnnBackendDescriptor_t graph = create(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    if (target.handle)
      set(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &target.handle);
    set(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
        (int64_t)operations.size(), operations.data());
    finalize(graph, "operation graph");
    return graph;
  }

  // The engine configurations cuDNN's heuristics in `mode` propose for the graph, best first.
  // cuDNN has already run each engine's support check on them (does the engine recognise the
  // graph's pattern, take these shapes, strides and types, fit this device); those that failed
  // are left out.
  std::vector<cudnnBackendDescriptor_t> engine_configs(const PlanTarget& target,
                                                       cudnnBackendDescriptor_t graph,
                                                       cudnnBackendHeurMode_t mode) {
    cudnnBackendDescriptor_t heuristics = create(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    set_desc(heuristics, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph);
    set(heuristics, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
    if (target.device) set_desc(heuristics, CUDNN_ATTR_ENGINEHEUR_DEVICEPROP, target.device);
    finalize(heuristics, "engine heuristics");
    const int kMaxConfigs = 8;
    std::vector<cudnnBackendDescriptor_t> configs(kMaxConfigs);
    for (auto& c : configs) c = create(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    int64_t found = 0;
    if (ok())
      check(cudnnBackendGetAttribute(heuristics, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                     CUDNN_TYPE_BACKEND_DESCRIPTOR, kMaxConfigs, &found,
                                     configs.data()),
            "heuristics results");
    configs.resize(ok() ? (size_t)found : 0);
    return configs;
  }

  // The first engine, from heuristics mode A then the fallback list, whose execution plan
  // finalizes on the handle's device.
  cudnnBackendDescriptor_t build_plan(cudnnHandle_t handle, int64_t* workspace_bytes) {
    const PlanTarget target{handle, nullptr};
    cudnnBackendDescriptor_t graph = operation_graph(target);
    for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
      if (!ok()) return nullptr;
      for (cudnnBackendDescriptor_t config : engine_configs(target, graph, mode)) {
        cudnnBackendDescriptor_t plan = try_plan(handle, config, workspace_bytes);
        if (!plan) continue;
        owned.push_back(plan);
        return plan;
      }
    }
    if (ok()) error = "no cuDNN engine accepts the attention graph: " + last_error();
    return nullptr;
  }

  // An execution plan of one engine configuration, or null if the engine refuses the graph.
  static cudnnBackendDescriptor_t try_plan(cudnnHandle_t handle, cudnnBackendDescriptor_t config,
                                           int64_t* workspace_bytes) {
    cudnnBackendDescriptor_t plan = nullptr;
    if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan) !=
        CUDNN_STATUS_SUCCESS)
      return nullptr;
    bool built =
        cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1,
                                 &handle) == CUDNN_STATUS_SUCCESS &&
        cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                                 CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &config) ==
            CUDNN_STATUS_SUCCESS &&
        cudnnBackendFinalize(plan) == CUDNN_STATUS_SUCCESS;
    int64_t count = 0;
    built = built && cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                              CUDNN_TYPE_INT64, 1, &count,
                                              workspace_bytes) == CUDNN_STATUS_SUCCESS;
    if (built) return plan;
    cudnnBackendDestroyDescriptor(plan);
    return nullptr;
  }

  // The global index of the engine an engine configuration runs (-1 if cuDNN will not say).
  static int64_t engine_index(cudnnBackendDescriptor_t config) {
    cudnnBackendDescriptor_t engine = nullptr;
    int64_t index = -1, count = 0;
    if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &engine) !=
        CUDNN_STATUS_SUCCESS)
      return -1;
    if (cudnnBackendGetAttribute(config, CUDNN_ATTR_ENGINECFG_ENGINE,
                                 CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &count, &engine) ==
        CUDNN_STATUS_SUCCESS)
      cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1,
                               &count, &index);
    cudnnBackendDestroyDescriptor(engine);
    return index;
  }

  ~GraphBuilder() {
    for (auto it = owned.rbegin(); it != owned.rend(); ++it) cudnnBackendDestroyDescriptor(*it);
  }
};

// What one call needs beyond the plan: the uids of the tensors that live in memory, in the
// order the call supplies their pointers, plus where the fp32 workspace tensors sit.
struct Plan {
  bool backward = false;
  GraphVariant variant = GraphVariant::AsTrained;
  int B = 0, T = 0, NH = 0, HS = 0;
  std::unique_ptr<GraphBuilder> graph;  // owns the plan and every descriptor it refers to
  cudnnBackendDescriptor_t plan = nullptr;
  std::vector<int64_t> uids;          // memory tensors, then the by-value scalars
  std::vector<float> scalars;         // values of the by-value tensors
  int64_t engine_workspace = 0;       // bytes cuDNN asks for
  size_t extra_workspace = 0;         // our fp32 tensors in workspace (backward: D and dQ)
  size_t dq_accum_offset = 0;         // offset of dQ's fp32 accumulator in the workspace
  std::string error;                  // why no plan could be built
};

struct PlanCache {
  cudnnHandle_t handle = nullptr;  // null if cuDNN could not start (then no plan is built)
  std::string handle_error;
  std::vector<std::unique_ptr<Plan>> plans;
};

// Row-major strides of a contiguous tensor.
Dims packed_strides(const Dims& d) {
  return {d[1] * d[2] * d[3], d[2] * d[3], d[3], 1};
}

struct Layout {  // the dims and strides of the packed (B,T,3C) and (B,T,C) buffers, per head
  Dims bhtd, bhdt, bhtt, bht1;
  Dims qkv_strides, qkv_t_strides, out_strides;
  Dims scores_strides, scores_t_strides, rows_strides;
  Layout(int64_t B, int64_t T, int64_t NH, int64_t HS) {
    const int64_t C = NH * HS;
    bhtd = {B, NH, T, HS};
    bhdt = {B, NH, HS, T};
    bhtt = {B, NH, T, T};
    bht1 = {B, NH, T, 1};
    qkv_strides = {T * 3 * C, HS, 3 * C, 1};    // q, k or v of packed qkv, as (B,NH,T,HS)
    qkv_t_strides = {T * 3 * C, HS, 1, 3 * C};  // k or v transposed, as (B,NH,HS,T)
    out_strides = {T * C, HS, C, 1};            // out, dout: (B,T,C) as (B,NH,T,HS)
    scores_strides = packed_strides(bhtt);
    scores_t_strides = {NH * T * T, T * T, 1, T};  // (B,NH,T,T) read transposed
    rows_strides = packed_strides(bht1);
  }
};

const float kMinusInfinity = -std::numeric_limits<float>::infinity();

// uids in the order forward() passes pointers: qkv's q, k, v, out, lse, then scale, -inf.
void add_forward_operations(Plan& p) {
  using Kind = GraphBuilder::Kind;
  GraphBuilder& g = *p.graph;
  Layout l(p.B, p.T, p.NH, p.HS);
  Tensor q = g.tensor(l.bhtd, l.qkv_strides, CUDNN_DATA_BFLOAT16, Kind::Memory);
  Tensor kt = g.tensor(l.bhdt, l.qkv_t_strides, CUDNN_DATA_BFLOAT16, Kind::Memory);
  Tensor v = g.tensor(l.bhtd, l.qkv_strides, CUDNN_DATA_BFLOAT16, Kind::Memory);
  Tensor o = g.tensor(l.bhtd, l.out_strides, CUDNN_DATA_BFLOAT16, Kind::Memory);
  Tensor stats = g.tensor(l.bht1, l.rows_strides, CUDNN_DATA_FLOAT, Kind::Memory);
  Tensor scale = g.scalar(), minus_infinity = g.scalar();

  Tensor s = g.scratch(l.bhtt, l.scores_strides);
  g.matmul(q, kt, s);
  Tensor scaled = g.scratch(l.bhtt, l.scores_strides);
  g.binary(CUDNN_POINTWISE_MUL, s, scale, scaled);
  // The negative test's variant masks after subtracting the row max instead of before: the same
  // probabilities in exact arithmetic, but not the pattern cuDNN's flash engines recognise.
  const bool swapped = p.variant == GraphVariant::MaskAndMaxSwapped;
  Tensor masked =
      swapped ? scaled : g.causal_mask(scaled, l.bhtt, l.scores_strides, minus_infinity);
  Tensor row_max = g.scratch(l.bht1, l.rows_strides);
  g.reduction(CUDNN_REDUCE_TENSOR_MAX, masked, row_max);
  Tensor shifted = g.scratch(l.bhtt, l.scores_strides);
  g.binary(CUDNN_POINTWISE_SUB, masked, row_max, shifted);
  if (swapped) shifted = g.causal_mask(shifted, l.bhtt, l.scores_strides, minus_infinity);
  Tensor e = g.scratch(l.bhtt, l.scores_strides);
  g.pointwise(CUDNN_POINTWISE_EXP, shifted, e);
  Tensor row_sum = g.scratch(l.bht1, l.rows_strides);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, e, row_sum);
  Tensor log_sum = g.scratch(l.bht1, l.rows_strides);
  g.pointwise(CUDNN_POINTWISE_LOG, row_sum, log_sum);
  g.binary(CUDNN_POINTWISE_ADD, row_max, log_sum, stats);
  Tensor probs = g.scratch(l.bhtt, l.scores_strides, CUDNN_DATA_BFLOAT16);
  g.binary(CUDNN_POINTWISE_DIV, e, row_sum, probs);
  g.matmul(probs, v, o);

  p.uids = {q.uid, kt.uid, v.uid, o.uid, stats.uid, scale.uid, minus_infinity.uid};
  p.scalars = {1.0f / std::sqrt((float)p.HS), kMinusInfinity};
}

// uids in the order backward() passes pointers: q, k, v, out, dout, lse, dq, dk, dv, D, the dQ
// accumulator, then the scalars scale, -inf, 1.
void add_backward_operations(Plan& p) {
  using Kind = GraphBuilder::Kind;
  GraphBuilder& g = *p.graph;
  Layout l(p.B, p.T, p.NH, p.HS);
  const cudnnDataType_t bf16 = CUDNN_DATA_BFLOAT16;
  Tensor q = g.tensor(l.bhtd, l.qkv_strides, bf16, Kind::Memory);
  Tensor kt = g.tensor(l.bhdt, l.qkv_t_strides, bf16, Kind::Memory);
  Tensor vt = g.tensor(l.bhdt, l.qkv_t_strides, bf16, Kind::Memory);
  Tensor o = g.tensor(l.bhtd, l.out_strides, bf16, Kind::Memory);
  Tensor dout = g.tensor(l.bhtd, l.out_strides, bf16, Kind::Memory);
  Tensor stats = g.tensor(l.bht1, l.rows_strides, CUDNN_DATA_FLOAT, Kind::Memory);
  Tensor dq = g.tensor(l.bhtd, l.qkv_strides, bf16, Kind::Memory);
  Tensor dk = g.tensor(l.bhtd, l.qkv_strides, bf16, Kind::Memory);
  Tensor dv = g.tensor(l.bhtd, l.qkv_strides, bf16, Kind::Memory);
  Tensor delta = g.tensor(l.bht1, l.rows_strides, CUDNN_DATA_FLOAT, Kind::Memory);
  Tensor dq_accum = g.tensor(l.bhtd, packed_strides(l.bhtd), CUDNN_DATA_FLOAT, Kind::Memory);
  Tensor scale = g.scalar(), minus_infinity = g.scalar(), one = g.scalar();

  // D = rowsum(dO * O), the softmax-backward correction term.
  Tensor dout_out = g.scratch(l.bhtd, packed_strides(l.bhtd));
  g.binary(CUDNN_POINTWISE_MUL, dout, o, dout_out);
  Tensor row_dot = g.scratch(l.bht1, l.rows_strides);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, dout_out, row_dot);
  g.binary(CUDNN_POINTWISE_MUL, row_dot, one, delta);

  // P = exp(mask(Q K^T * scale) - Stats), recomputed.
  Tensor s = g.scratch(l.bhtt, l.scores_strides);
  g.matmul(q, kt, s);
  Tensor scaled = g.scratch(l.bhtt, l.scores_strides);
  g.binary(CUDNN_POINTWISE_MUL, s, scale, scaled);
  Tensor shifted = g.scratch(l.bhtt, l.scores_strides);
  g.binary(CUDNN_POINTWISE_SUB, scaled, stats, shifted);
  Tensor masked = g.causal_mask(shifted, l.bhtt, l.scores_strides, minus_infinity);
  Tensor probs = g.scratch(l.bhtt, l.scores_strides);
  g.pointwise(CUDNN_POINTWISE_EXP, masked, probs);

  // dV = P^T dO.
  Tensor probs_t = g.scratch(l.bhtt, l.scores_t_strides, bf16);
  g.reshape(probs, probs_t);
  g.matmul(probs_t, dout, dv);

  // dS = P * (dO V^T - D) * scale.
  Tensor dprobs = g.scratch(l.bhtt, l.scores_strides);
  g.matmul(dout, vt, dprobs);
  Tensor centered = g.scratch(l.bhtt, l.scores_strides);
  g.binary(CUDNN_POINTWISE_SUB, dprobs, delta, centered);
  Tensor dscores_unscaled = g.scratch(l.bhtt, l.scores_strides);
  g.binary(CUDNN_POINTWISE_MUL, centered, probs, dscores_unscaled);
  Tensor dscores = g.scratch(l.bhtt, l.scores_strides);
  g.binary(CUDNN_POINTWISE_MUL, dscores_unscaled, scale, dscores);

  // dK = dS^T Q.
  Tensor dscores_t = g.scratch(l.bhtt, l.scores_t_strides, bf16);
  g.reshape(dscores, dscores_t);
  g.matmul(dscores_t, q, dk);

  // dQ = dS K, accumulated in fp32, then cast into dqkv.
  Tensor k = g.scratch(l.bhtd, l.qkv_strides);
  g.reshape(kt, k);
  g.matmul(dscores, k, dq_accum);
  g.pointwise(CUDNN_POINTWISE_IDENTITY, dq_accum, dq);

  p.uids = {q.uid,  kt.uid, vt.uid,    o.uid,        dout.uid,           stats.uid, dq.uid,
            dk.uid, dv.uid, delta.uid, dq_accum.uid, scale.uid, minus_infinity.uid, one.uid};
  p.scalars = {1.0f / std::sqrt((float)p.HS), kMinusInfinity, 1.0f};
  const size_t rows = (size_t)p.B * p.NH * p.T;
  p.dq_accum_offset = round_up(rows * sizeof(float), 256);
  p.extra_workspace = p.dq_accum_offset + round_up(rows * p.HS * sizeof(float), 256);
}

// The tensors and operations of one direction's graph, each descriptor finalized (which is
// where cuDNN checks shapes, strides and types). Needs no GPU.
std::unique_ptr<Plan> describe(bool backward, int B, int T, int NH, int HS,
                               GraphVariant variant = GraphVariant::AsTrained) {
  auto p = std::make_unique<Plan>();
  p->backward = backward;
  p->variant = variant;
  p->B = B, p->T = T, p->NH = NH, p->HS = HS;
  p->graph = std::make_unique<GraphBuilder>();
  if (backward)
    add_backward_operations(*p);
  else
    add_forward_operations(*p);
  return p;
}

// The stream's plans and cuDNN handle, created at the first use. A node whose cuDNN is missing
// or broken (the offline bundle carries only its small loader library, say) gets no handle and
// every plan reports why, so "auto" quietly keeps the hand-written kernels.
PlanCache& cache_of(Stream s) {
  if (!s->cudnn_plans) {
    PlanCache* c = new PlanCache;
    cudnnStatus_t st = cudnnCreate(&c->handle);
    if (st != CUDNN_STATUS_SUCCESS) {
      c->handle = nullptr;
      c->handle_error = std::string("cudnnCreate: ") + cudnnGetErrorString(st);
    }
    s->cudnn_plans = c;
  }
  PlanCache& c = *static_cast<PlanCache*>(s->cudnn_plans);
  if (c.handle) CUDNN_CHECK(cudnnSetStream(c.handle, s->stream));
  return c;
}

Plan& plan_for(Stream s, bool backward, int B, int T, int NH, int HS) {
  PlanCache& c = cache_of(s);
  for (const auto& p : c.plans)
    if (p->backward == backward && p->B == B && p->T == T && p->NH == NH && p->HS == HS)
      return *p;
  std::unique_ptr<Plan> p = describe(backward, B, T, NH, HS);
  if (c.handle) p->plan = p->graph->build_plan(c.handle, &p->engine_workspace);
  if (!p->plan) p->error = c.handle ? p->graph->error : c.handle_error;
  c.plans.push_back(std::move(p));
  return *c.plans.back();
}

// Executes plan p with the memory tensors at `pointers` (in p.uids order); the by-value
// scalars are appended here. `workspace` holds engine_workspace + extra_workspace bytes. If cuDNN
// refuses to run the plan, the plan is dropped (p.plan = null, p.error says why) and the caller
// falls back to the hand-written kernels from then on.
bool execute(Stream s, Plan& p, std::vector<void*> pointers, void* workspace, std::string* why) {
  for (const float& value : p.scalars) pointers.push_back(const_cast<float*>(&value));
  CHECK(pointers.size() == p.uids.size(), "cuDNN attention: %zu pointers for %zu tensors",
        pointers.size(), p.uids.size());
  GraphBuilder pack_owner;
  cudnnBackendDescriptor_t pack = pack_owner.create(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  pack_owner.set(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64,
                 (int64_t)p.uids.size(), p.uids.data());
  pack_owner.set(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR,
                 (int64_t)pointers.size(), pointers.data());
  pack_owner.set(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
  pack_owner.finalize(pack, "variant pack");
  if (pack_owner.ok())
    pack_owner.check(cudnnBackendExecute(cache_of(s).handle, p.plan, pack), "execute");
  if (pack_owner.ok()) return true;
  std::fprintf(stderr, "warning: cuDNN attention %s failed for B=%d T=%d NH=%d HS=%d (%s); using "
               "the hand-written kernels for this shape\n", p.backward ? "backward" : "forward",
               p.B, p.T, p.NH, p.HS, pack_owner.error.c_str());
  p.plan = nullptr;
  p.error = pack_owner.error;
  if (why) *why = p.error;
  return false;
}

// The plan for this call's shape, or null (and *why) if cuDNN cannot run it.
Plan* ready_plan(Stream s, bool backward, int B, int T, int NH, int HS, std::string* why) {
  Plan& p = plan_for(s, backward, B, T, NH, HS);
  if (p.plan) return &p;
  if (why) *why = p.error;
  return nullptr;
}

// The q, k and v columns of a packed (B,T,3C) bf16 buffer: C elements apart.
struct Columns {
  void *q, *k, *v;
  Columns(const void* packed, size_t C) {
    __nv_bfloat16* x = static_cast<__nv_bfloat16*>(const_cast<void*>(packed));
    q = x, k = x + C, v = x + 2 * C;
  }
};

// The oldest cuDNN this path is taken with: the version test/test_cudnn_graph.cu was run against
// (older ones gave NaNs in the backward at T not a multiple of 128).
const size_t kOldestCudnn = 91900;

// Why cuDNN is not asked at all for this call, or null.
const char* refusal(bool backward, int T) {
  if (cudnnGetVersion() < kOldestCudnn)
    return "cuDNN older than 9.19.0, the oldest version this path is tested with";
  // cudnn-frontend refuses a one-token backward, and no GPU test has shown this graph right there.
  if (backward && T == 1) return "a one-token backward (T = 1) is left to the flash kernels";
  return nullptr;
}

bool refuse(const char* reason, std::string* why) {
  if (why) *why = reason;
  return false;
}

}  // namespace

bool applies(int HS, DType dt, std::initializer_list<const void*> pointers) {
  return dt == DType::BF16 && HS % 8 == 0 && HS <= 128 && aligned16(pointers);
}

bool forward(Stream s, void* out, float* lse, const void* qkv, int B, int T, int NH, int HS,
             std::string* why) {
  if (const char* reason = refusal(false, T)) return refuse(reason, why);
  Plan* p = ready_plan(s, false, B, T, NH, HS, why);
  if (!p) return false;
  const Columns x(qkv, (size_t)NH * HS);
  void* workspace = p->engine_workspace > 0 ? stream_scratch(s, (size_t)p->engine_workspace)
                                            : nullptr;
  return execute(s, *p, {x.q, x.k, x.v, out, lse}, workspace, why);
}

bool backward(Stream s, void* dqkv, const void* dout, const void* qkv, const void* out,
              const float* lse, int B, int T, int NH, int HS, std::string* why) {
  if (const char* reason = refusal(true, T)) return refuse(reason, why);
  Plan* p = ready_plan(s, true, B, T, NH, HS, why);
  if (!p) return false;
  const Columns x(qkv, (size_t)NH * HS), dx(dqkv, (size_t)NH * HS);
  const size_t engine_bytes = round_up((size_t)p->engine_workspace, 256);
  char* workspace = (char*)stream_scratch(s, engine_bytes + p->extra_workspace);
  char* delta = workspace + engine_bytes;
  char* dq_accum = delta + p->dq_accum_offset;
  // The engine adds every key block's share of dQ into this fp32 accumulator, so it must start at
  // zero. cudnn-frontend zero-fills it before every execution too, and no cuDNN version documents
  // that the engine does it itself, so the memset stays (its cost: 4 x B x NH x T x HS bytes).
  CUDA_CHECK(cudaMemsetAsync(dq_accum, 0, p->extra_workspace - p->dq_accum_offset, s->stream));
  return execute(s, *p,
                 {x.q, x.k, x.v, (void*)out, (void*)dout, (void*)lse, dx.q, dx.k, dx.v, delta,
                  dq_accum},
                 workspace, why);
}

bool describe_graph(bool backward, int B, int T, int NH, int HS, int* operations,
                    std::string* error) {
  std::unique_ptr<Plan> p = describe(backward, B, T, NH, HS);
  *operations = (int)p->graph->operations.size();
  *error = p->graph->error;
  return p->graph->ok();
}

std::vector<int64_t> engines_for_described_device(bool backward, int B, int T, int NH, int HS,
                                                  const std::string& device_json,
                                                  GraphVariant variant, std::string* error) {
  std::unique_ptr<Plan> p = describe(backward, B, T, NH, HS, variant);
  GraphBuilder& g = *p->graph;
  cudnnBackendDescriptor_t device = g.create(CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR);
  g.set(device, CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION, CUDNN_TYPE_CHAR,
        (int64_t)device_json.size(), device_json.data());
  g.finalize(device, "device properties");
  const PlanTarget target{nullptr, device};
  std::vector<int64_t> engines;
  cudnnBackendDescriptor_t graph = g.operation_graph(target);
  for (cudnnBackendDescriptor_t config : g.engine_configs(target, graph, CUDNN_HEUR_MODE_A))
    engines.push_back(GraphBuilder::engine_index(config));
  *error = g.ok() && engines.empty() ? "heuristics mode A offers no engine: " + last_error()
                                     : g.error;
  return engines;
}

void release_stream_state(StreamImpl* s) {
  if (!s->cudnn_plans) return;
  PlanCache* c = static_cast<PlanCache*>(s->cudnn_plans);
  c->plans.clear();  // descriptors first, then the handle they were built with
  if (c->handle) CUDNN_CHECK(cudnnDestroy(c->handle));
  delete c;
  s->cudnn_plans = nullptr;
}

}  // namespace cudnn_sdpa
}  // namespace ops
