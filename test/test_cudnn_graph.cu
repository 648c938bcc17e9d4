// test/test_cudnn_graph.cu - the cuDNN attention graphs (kernels/cuda/attention_cudnn.cu) checked
// without a GPU: cuDNN validates each tensor and operation descriptor when it is finalized
// (matching matmul dimensions, broadcastable pointwise operands, reductions onto a shape of
// extent 1, types), and that needs no device. So CI builds the forward and backward graphs for
// several shapes, awkward ones included, and requires every descriptor to finalize.
//
// What it cannot check here: that an engine accepts the whole graph (that needs a cuDNN handle,
// hence a GPU) and that the numbers are right (test/gpu/test_attention.cu does both on a GPU).
// A negative control proves the validation is live on this machine: a matmul whose inner
// dimensions disagree must be rejected, or the positive results would mean nothing.
#include <cudnn.h>

#include <cstdio>
#include <string>
#include <vector>

#include "kernels/cuda/attention_cudnn.cuh"

namespace {

cudnnBackendDescriptor_t tensor(std::vector<int64_t> dims, int64_t uid) {
  std::vector<int64_t> strides = {dims[1] * dims[2] * dims[3], dims[2] * dims[3], dims[3], 1};
  cudnnBackendDescriptor_t d = nullptr;
  cudnnDataType_t type = CUDNN_DATA_FLOAT;
  int64_t alignment = 16;
  cudnnBackendCreateDescriptor(CUDNN_BACKEND_TENSOR_DESCRIPTOR, &d);
  cudnnBackendSetAttribute(d, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type);
  cudnnBackendSetAttribute(d, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data());
  cudnnBackendSetAttribute(d, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.data());
  cudnnBackendSetAttribute(d, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
  cudnnBackendSetAttribute(d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment);
  cudnnBackendFinalize(d);
  return d;
}

// c(1,1,8,8) = a(1,1,8,k) @ b(1,1,16,8): finalizes only if k == 16.
bool matmul_finalizes(int64_t k) {
  cudnnBackendDescriptor_t a = tensor({1, 1, 8, k}, 1), b = tensor({1, 1, 16, 8}, 2),
                           c = tensor({1, 1, 8, 8}, 3), mm = nullptr, op = nullptr;
  cudnnDataType_t math = CUDNN_DATA_FLOAT;
  cudnnBackendCreateDescriptor(CUDNN_BACKEND_MATMUL_DESCRIPTOR, &mm);
  cudnnBackendSetAttribute(mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &math);
  cudnnBackendFinalize(mm);
  cudnnBackendCreateDescriptor(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, &op);
  const cudnnBackendAttributeType_t desc = CUDNN_TYPE_BACKEND_DESCRIPTOR;
  cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_MATMUL_DESC, desc, 1, &mm);
  cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, desc, 1, &a);
  cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, desc, 1, &b);
  cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, desc, 1, &c);
  bool ok = cudnnBackendFinalize(op) == CUDNN_STATUS_SUCCESS;
  for (cudnnBackendDescriptor_t d : {op, mm, c, b, a}) cudnnBackendDestroyDescriptor(d);
  return ok;
}

}  // namespace

int main() {
  int failures = 0;
  auto expect = [&](bool ok, const std::string& what) {
    std::printf("  %-56s %s\n", what.c_str(), ok ? "ok" : "FAIL");
    if (!ok) failures++;
  };
  expect(matmul_finalizes(16), "control: a well-formed matmul finalizes");
  expect(!matmul_finalizes(12), "control: a matmul with mismatched inner dims is rejected");

  struct Shape { int B, T, NH, HS; };
  // Operation counts of the graphs in attention_cudnn.cu: forward 2 matmuls, 2 reductions and
  // 10 pointwise ops (scale, row and column index, compare, select, sub, exp, log, add, div);
  // backward 5 matmuls, 1 reduction, 3 reshapes, 13 pointwise. A change to a graph must update
  // these on purpose.
  const int kForwardOps = 14, kBackwardOps = 22;
  for (Shape sh : {Shape{1, 1, 1, 64}, Shape{2, 37, 3, 64}, Shape{4, 1024, 12, 64},
                   Shape{2, 333, 3, 128}, Shape{1, 200, 5, 40}}) {
    for (bool backward : {false, true}) {
      int operations = 0;
      std::string error;
      bool ok = ops::cudnn_sdpa::describe_graph(backward, sh.B, sh.T, sh.NH, sh.HS, &operations,
                                                &error);
      char what[128];
      std::snprintf(what, sizeof(what), "%s graph B=%d T=%d NH=%d HS=%d: %d operations",
                    backward ? "backward" : "forward", sh.B, sh.T, sh.NH, sh.HS, operations);
      expect(ok && operations == (backward ? kBackwardOps : kForwardOps), what);
      if (!ok) std::printf("    cuDNN: %s\n", error.c_str());
    }
  }
  std::printf("test_cudnn_graph: %d failure(s)\n", failures);
  return failures ? 1 : 0;
}
