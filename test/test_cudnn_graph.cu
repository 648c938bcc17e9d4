// test/test_cudnn_graph.cu - the cuDNN attention graphs (kernels/cuda/attention_cudnn.cu) checked
// without a GPU: cuDNN validates each tensor and operation descriptor when it is finalized
// (matching matmul dimensions, broadcastable pointwise operands, reductions onto a shape of
// extent 1, types), and that needs no device. So CI builds the forward and backward graphs for
// several shapes, awkward ones included, and requires every descriptor to finalize.
//
// Then cuDNN's own verdict on the whole graph, still without a GPU. Since cuDNN 9.8 its
// heuristics accept a device-properties descriptor in place of a handle, so they run here against
// a described device: test/cudnn_devices/ holds an H100 SXM and an H200 SXM description (the
// cudaDeviceProp fields cuDNN reads, from NVIDIA's published figures for those parts: 132 SMs,
// compute capability 9.0, 227 KiB of opt-in shared memory per block, 50 MiB of L2). For every
// shape below, heuristics mode A must offer an engine for both directions: cuDNN has then run
// each engine's support check (does it recognise the graph as attention, take these strides,
// types and head size, fit the device's shared memory) and kept only those that pass. On this
// cuDNN (9.19) the forward gets the sm90 flash engine 2 and the backward engine 6.
//
// cuDNN's engines load the CUDA driver even to check support; with no driver installed the test
// loads the CUDA toolkit's stub libcuda (whose calls all fail: nothing here runs a kernel).
// Building an execution plan, which compiles and loads the kernel, does need a GPU, as do the
// numbers (test/gpu/test_attention.cu checks both on a GPU).
//
// Negative controls prove each check is live: a matmul whose inner dimensions disagree must be
// rejected by finalization; a forward graph with the causal mask and the row-max subtraction
// swapped (equal in exact arithmetic, not the pattern the flash engines implement) and a Volta
// description (no flash engine before compute capability 8.0) must get no engine.
#include <cudnn.h>
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
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

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The CUDA driver cuDNN's engines load: the real one where a GPU is installed, else the
// toolkit's stub, loaded first under the soname cuDNN asks for.
bool load_cuda_driver(std::string* which) {
  if (dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL)) {
    *which = "the installed driver";
    return true;
  }
  const char* home = std::getenv("CUDA_HOME");
  const std::string stub = std::string(home ? home : "/usr/local/cuda") + "/lib64/stubs/libcuda.so";
  *which = "the toolkit's stub " + stub;
  return dlopen(stub.c_str(), RTLD_NOW | RTLD_GLOBAL) != nullptr;
}

std::string engine_list(const std::vector<int64_t>& engines) {
  std::string list;
  for (int64_t e : engines) list += (list.empty() ? "" : ",") + std::to_string(e);
  return list.empty() ? "none" : list;
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

  // cuDNN's verdict on described devices. The shapes: GPT-2 124M and its micro-batches, head
  // sizes 40 (not a power of two), 64 and 128, odd lengths, one token, and Llama-3 8B's 32 heads
  // of 128 at 8K tokens.
  std::string driver;
  const bool driver_loaded = load_cuda_driver(&driver);
  expect(driver_loaded, "a CUDA driver library to load (" + driver + ")");
  std::printf("  cuDNN %zu\n", cudnnGetVersion());
  using ops::cudnn_sdpa::GraphVariant;
  const std::string dir = "test/cudnn_devices/";
  for (const char* device : {"h100_sxm.json", "h200_sxm.json"}) {
    const std::string json = read_text(dir + device);
    expect(!json.empty(), std::string("read ") + dir + device);
    for (Shape sh : {Shape{1, 200, 5, 40}, Shape{8, 1024, 12, 64}, Shape{2, 2048, 16, 128},
                     Shape{2, 37, 3, 64}, Shape{2, 333, 3, 128}, Shape{1, 1, 12, 64},
                     Shape{1, 8192, 32, 128}}) {
      for (bool backward : {false, true}) {
        if (backward && sh.T == 1) continue;  // the trainer never asks cuDNN (attention.cu)
        std::string error;
        std::vector<int64_t> engines = ops::cudnn_sdpa::engines_for_described_device(
            backward, sh.B, sh.T, sh.NH, sh.HS, json, GraphVariant::AsTrained, &error);
        char what[160];
        std::snprintf(what, sizeof(what), "%s: %s B=%d T=%d NH=%d HS=%d: engines %s", device,
                      backward ? "backward" : "forward", sh.B, sh.T, sh.NH, sh.HS,
                      engine_list(engines).c_str());
        expect(!engines.empty(), what);
        if (engines.empty()) std::printf("    cuDNN: %s\n", error.c_str());
      }
    }
    std::string error;
    std::vector<int64_t> broken = ops::cudnn_sdpa::engines_for_described_device(
        false, 4, 1024, 12, 64, json, GraphVariant::MaskAndMaxSwapped, &error);
    expect(broken.empty(), std::string(device) + ": control: mask and max swapped gets no engine (" +
                               engine_list(broken) + ")");
  }
  std::string volta = read_text(dir + "h100_sxm.json"), error;
  const std::string cc = "\"deviceVer\": 900";
  expect(volta.find(cc) != std::string::npos, "control: the H100 description says " + cc);
  if (volta.find(cc) != std::string::npos) volta.replace(volta.find(cc), cc.size(), "\"deviceVer\": 700");
  std::vector<int64_t> on_volta = ops::cudnn_sdpa::engines_for_described_device(
      false, 4, 1024, 12, 64, volta, GraphVariant::AsTrained, &error);
  expect(on_volta.empty(), "control: a compute capability 7.0 description gets no engine (" +
                               engine_list(on_volta) + ")");

  std::printf("test_cudnn_graph: %d failure(s)\n", failures);
  return failures ? 1 : 0;
}
