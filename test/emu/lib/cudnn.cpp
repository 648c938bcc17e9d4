// test/emu/lib/cudnn.cpp - the cuDNN stand-in of the emulated CUDA build: just enough of the
// graph ("backend") API for kernels/cuda/attention_cudnn.cu to find out, the way it would on a
// GPU whose cuDNN has no engine for its graph, that cuDNN cannot run attention here, so that
// attention "auto" (and "cudnn", with a warning) takes the hand-written flash kernels.
//
// What it does: cudnnGetVersion gives the headers' version; cudnnCreate, cudnnDestroy and
// cudnnSetStream succeed (the emulated device is a device). Descriptors of every type can be created, given attributes and destroyed; tensor,
// pointwise, reduction, matmul, reshape and operation descriptors finalize (without checking
// their attributes: the real library's validation of these graphs is test/test_cudnn_graph.cu's
// job, with the real libcudnn). Finalizing an operation graph - or any later step: heuristics,
// engine configs, execution plans, variant packs - returns CUDNN_STATUS_NOT_SUPPORTED and leaves
// a message for cudnnGetLastErrorString; cudnnBackendGetAttribute and cudnnBackendExecute return
// CUDNN_STATUS_NOT_SUPPORTED too. Nothing is ever computed.
#include <cudnn.h>

#include <cstdio>
#include <cstring>
#include <string>

struct cudnnContext {
  unsigned magic;
};

namespace {

constexpr unsigned kHandleMagic = 0x43444e48, kDescriptorMagic = 0x43444e44;
constexpr const char* kNoEngine =
    "cuDNN stand-in (emulated CUDA build): no engine runs cuDNN graphs here";

struct Descriptor {
  unsigned magic;
  cudnnBackendDescriptorType_t type;
  bool finalized;
};

std::string& last_error() {
  static std::string message;
  return message;
}

cudnnStatus_t refuse(cudnnStatus_t status, const std::string& what) {
  last_error() = what;
  return status;
}

Descriptor* descriptor_of(cudnnBackendDescriptor_t d) {
  Descriptor* p = static_cast<Descriptor*>(d);
  return p && p->magic == kDescriptorMagic ? p : nullptr;
}

// The descriptors that describe a graph's pieces; the rest (the graph and what follows it)
// would need an engine.
bool is_graph_piece(cudnnBackendDescriptorType_t t) {
  switch (t) {
    case CUDNN_BACKEND_TENSOR_DESCRIPTOR:
    case CUDNN_BACKEND_POINTWISE_DESCRIPTOR:
    case CUDNN_BACKEND_REDUCTION_DESCRIPTOR:
    case CUDNN_BACKEND_MATMUL_DESCRIPTOR:
    case CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR:
    case CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR:
    case CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR:
    case CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR: return true;
    default: return false;
  }
}

}  // namespace

cudnnStatus_t cudnnCreate(cudnnHandle_t* handle) {
  if (!handle) return refuse(CUDNN_STATUS_BAD_PARAM, "cudnnCreate: null handle pointer");
  *handle = new cudnnContext{kHandleMagic};
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnDestroy(cudnnHandle_t handle) {
  if (!handle || handle->magic != kHandleMagic)
    return refuse(CUDNN_STATUS_BAD_PARAM, "cudnnDestroy: not a handle");
  handle->magic = 0;
  delete handle;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetStream(cudnnHandle_t handle, cudaStream_t stream) {
  if (!handle || handle->magic != kHandleMagic)
    return refuse(CUDNN_STATUS_BAD_PARAM, "cudnnSetStream: not a handle");
  return CUDNN_STATUS_SUCCESS;
}

// The version of the headers it is built against, so the caller's version gate passes and the
// refusal comes where a GPU without an engine would give it: at the graph.
size_t cudnnGetVersion() { return CUDNN_VERSION; }

const char* cudnnGetErrorString(cudnnStatus_t status) {
  switch (status) {
    case CUDNN_STATUS_SUCCESS: return "CUDNN_STATUS_SUCCESS";
    case CUDNN_STATUS_NOT_INITIALIZED: return "CUDNN_STATUS_NOT_INITIALIZED";
    case CUDNN_STATUS_BAD_PARAM: return "CUDNN_STATUS_BAD_PARAM";
    case CUDNN_STATUS_NOT_SUPPORTED: return "CUDNN_STATUS_NOT_SUPPORTED";
    default: return "CUDNN_STATUS_(not produced by the stand-in)";
  }
}

void cudnnGetLastErrorString(char* message, size_t max_size) {
  if (!message || max_size == 0) return;
  std::snprintf(message, max_size, "%s", last_error().c_str());
}

cudnnStatus_t cudnnBackendCreateDescriptor(cudnnBackendDescriptorType_t type,
                                           cudnnBackendDescriptor_t* descriptor) {
  if (!descriptor) return refuse(CUDNN_STATUS_BAD_PARAM, "cudnnBackendCreateDescriptor: null");
  *descriptor = new Descriptor{kDescriptorMagic, type, false};
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendDestroyDescriptor(cudnnBackendDescriptor_t descriptor) {
  Descriptor* d = descriptor_of(descriptor);
  if (!d) return refuse(CUDNN_STATUS_BAD_PARAM, "cudnnBackendDestroyDescriptor: not a descriptor");
  d->magic = 0;
  delete d;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendSetAttribute(cudnnBackendDescriptor_t descriptor,
                                       cudnnBackendAttributeName_t name,
                                       cudnnBackendAttributeType_t type, int64_t count,
                                       const void* elements) {
  Descriptor* d = descriptor_of(descriptor);
  if (!d || d->finalized || count < 0 || (count > 0 && !elements))
    return refuse(CUDNN_STATUS_BAD_PARAM,
                  "cudnnBackendSetAttribute: no descriptor, a finalized one, or no elements");
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendFinalize(cudnnBackendDescriptor_t descriptor) {
  Descriptor* d = descriptor_of(descriptor);
  if (!d || d->finalized)
    return refuse(CUDNN_STATUS_BAD_PARAM, "cudnnBackendFinalize: no descriptor, or finalized");
  if (!is_graph_piece(d->type))
    return refuse(CUDNN_STATUS_NOT_SUPPORTED,
                  std::string(kNoEngine) + " (descriptor type " + std::to_string((int)d->type) + ")");
  d->finalized = true;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendGetAttribute(cudnnBackendDescriptor_t const descriptor,
                                       cudnnBackendAttributeName_t name,
                                       cudnnBackendAttributeType_t type, int64_t requested,
                                       int64_t* count, void* elements) {
  if (count) *count = 0;
  return refuse(CUDNN_STATUS_NOT_SUPPORTED, std::string(kNoEngine) + " (GetAttribute)");
}

cudnnStatus_t cudnnBackendExecute(cudnnHandle_t handle, cudnnBackendDescriptor_t plan,
                                  cudnnBackendDescriptor_t variant_pack) {
  return refuse(CUDNN_STATUS_NOT_SUPPORTED, std::string(kNoEngine) + " (Execute)");
}
