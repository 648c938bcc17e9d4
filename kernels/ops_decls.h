// kernels/ops_decls.h - the declarations of the backend seam. Read kernels/ops.h first: it holds
// the conventions (dtypes, "+=", shapes). No include guard on purpose: the GPU test includes this
// file twice, once as `ops` (CUDA) and once renamed to `ref` (the CPU oracle).
namespace ops {

struct StreamImpl;  // defined by each backend (CUDA: a cudaStream_t plus its cuBLASLt workspace)
struct EventImpl;
typedef StreamImpl* Stream;
typedef EventImpl* Event;

// ---------------------------------------------------------------------------------------------
// Device, memory, streams, events
// ---------------------------------------------------------------------------------------------
const char* backend_name();               // "cpu" or "cuda"
DeviceInfo device_init(int local_rank);   // pick the device of this rank on its node
bool device_memory_is_host();             // true on the CPU backend (no staging for MPI)

void* alloc(size_t bytes);                // aborts with a clear message when out of memory
void release(void* p);                    // nullptr is fine
// Synchronous: they wait for all work on every stream of the device first.
void copy_to_device(void* dst, const void* src, size_t bytes);
void copy_to_host(void* dst, const void* src, size_t bytes);
// Host to device in stream order, with no wait on other streams; src may be reused as soon as
// the call returns (the CUDA backend stages pageable memory). For per-step inputs.
void copy_to_device_async(void* dst, const void* src, size_t bytes, Stream s);
void copy_on_device(void* dst, const void* src, size_t bytes, Stream s);
void fill_zero(void* p, size_t bytes, Stream s);
size_t memory_in_use();                   // bytes currently allocated through alloc()
size_t memory_peak();                     // the most ever allocated at once

Stream stream_create(const StreamOptions& options);
void stream_destroy(Stream s);
void stream_sync(Stream s);               // wait on the host until the stream is idle
Event event_create();
void event_destroy(Event e);
void event_record(Event e, Stream s);
void stream_wait_event(Stream s, Event e);  // later work on s waits for e (no host wait)
void event_sync(Event e);
float event_elapsed_ms(Event start, Event end);  // CPU backend: host wall time between records
const char* attention_impl_name(Stream s);        // what AttentionImpl::Auto resolved to
void range_push(const char* name);        // NVTX range for profiles; no-op on the CPU
void range_pop();

// ---------------------------------------------------------------------------------------------
// Kernels of the GPT forward and backward
// ---------------------------------------------------------------------------------------------
// out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:]            out (B,T,C), wte (Vp,C), wpe (maxT,C)
void encoder_forward(void* out, const int* tokens, const void* wte, const void* wpe, int B, int T,
                     int C, DType dt, Stream s);
// dwte[tokens[b,t],:] += dout[b,t,:];  dwpe[t,:] += sum_b dout[b,t,:]    (deterministic order)
void encoder_backward(float* dwte, float* dwpe, const void* dout, const int* tokens, int B, int T,
                      int C, DType dt, Stream s);

// out = (inp - mean) * rstd * weight + bias over the last dim (eps 1e-5); mean, rstd (N) saved.
void layernorm_forward(void* out, float* mean, float* rstd, const void* inp, const void* weight,
                       const void* bias, int N, int C, DType dt, Stream s);
// dinp += dLN/dinp (dinp is the residual stream's gradient, so the residual add is fused here);
// dweight += sum_n dout * xhat;  dbias += sum_n dout.
void layernorm_backward(void* dinp, float* dweight, float* dbias, const void* dout,
                        const void* inp, const void* weight, const float* mean, const float* rstd,
                        int N, int C, DType dt, Stream s);

// y = inp (N,C) @ weight(OC,C)^T [+ bias (OC)] [+ residual (N,OC)]
// pre_gelu == nullptr: out = y.   pre_gelu != nullptr: pre_gelu = y, out = gelu(y) (no residual).
void matmul_forward(void* out, void* pre_gelu, const void* inp, const void* weight,
                    const void* bias, const void* residual, int N, int C, int OC, DType dt,
                    Stream s);
// dinp = dout (N,OC) @ weight (OC,C), times gelu'(gelu_input) when gelu_input (N,C) is given
//        (the GELU that produced inp, fused); dinp may be nullptr (not needed).
// dweight += dout^T @ inp (fp32);  dbias += sum_n dout (fp32) when dbias is given.
void matmul_backward(void* dinp, float* dweight, float* dbias, const void* dout, const void* inp,
                     const void* weight, const void* gelu_input, int N, int C, int OC, DType dt,
                     Stream s);

// GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
void gelu_forward(void* out, const void* inp, size_t n, DType dt, Stream s);
// dinp = dout * gelu'(inp); dinp may alias dout.
void gelu_backward(void* dinp, const void* inp, const void* dout, size_t n, DType dt, Stream s);

// Causal self-attention over packed qkv (B,T,3C): q, k, v of head h at columns h*HS, C + h*HS,
// 2C + h*HS. out (B,T,C) with head h at columns h*HS; lse (B,NH,T) fp32 is each query row's
// log-sum-exp of the scaled scores (natural log), which ring attention needs to merge blocks.
// Scores are scaled by 1/sqrt(HS). No (T,T) matrix is ever stored.
void attention_forward(void* out, float* lse, const void* qkv, int B, int T, int NH, int HS,
                       DType dt, Stream s);
// dqkv (B,T,3C) is written (not accumulated).
void attention_backward(void* dqkv, const void* dout, const void* qkv, const void* out,
                        const float* lse, int B, int T, int NH, int HS, DType dt, Stream s);

// The classifier, one pass per row over logits (N,Vp): softmax over the first V columns,
// losses[n] = -log p[targets[n]]. If dloss != 0 the logits are overwritten in place with the
// gradient of (dloss * sum_n losses[n]): (p - onehot) * dloss for columns < V, 0 for the padded
// ones. A target < 0 is ignored (loss 0, gradient row 0). Probabilities are never stored.
void classifier_forward_backward(void* logits, float* losses, const int* targets, float dloss,
                                 int N, int V, int Vp, DType dt, Stream s);

// ---------------------------------------------------------------------------------------------
// Optimizer and reductions (fp32)
// ---------------------------------------------------------------------------------------------
// AdamW on n elements (see AdamWStep). If param_out is given it receives the updated weights in
// dtype param_dt (the compute-precision working copy, rounded to nearest even).
void adamw_update(float* master, void* param_out, const float* grad, float* m, float* v,
                  size_t n, const AdamWStep& step, DType param_dt, Stream s);
// *out += sum_i x[i]^2 (out is one float on the device). Deterministic for a given n.
void sum_squares_accumulate(float* out, const float* x, size_t n, Stream s);
// *out += scale * sum_i x[i]. Deterministic for a given n.
void sum_accumulate(float* out, const float* x, size_t n, float scale, Stream s);
// dst[i] += src[i]
void add_inplace(float* dst, const float* src, size_t n, Stream s);
// dst = src converted (rounded to nearest even when narrowing).
void cast(void* dst, DType dst_dt, const void* src, DType src_dt, size_t n, Stream s);

}  // namespace ops
