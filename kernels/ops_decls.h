// kernels/ops_decls.h - the declarations of the backend seam. Read kernels/ops.h first: it holds
// the conventions (dtypes, "+=", shapes). No include guard on purpose: the GPU test includes this
// file twice, once as `ops` (CUDA) and once renamed to `ref` (the CPU oracle).
namespace ops {

struct StreamImpl;  // defined by each backend (CUDA: a cudaStream_t plus its cuBLASLt workspace)
struct EventImpl;
struct GraphImpl;   // a captured, instantiated CUDA graph (the CPU backend has none)
typedef StreamImpl* Stream;
typedef EventImpl* Event;
typedef GraphImpl* Graph;

// The dry stream: every op given it returns at once and does nothing (a sync returns, an event
// is neither recorded nor waited for). The planner (training/plan.cu) runs the real training step
// on it, over buffers that were counted, not allocated (kernels/allocator.h). Every op of both
// backends that takes a stream checks it first.
inline Stream dry_stream() {
  static char sentinel;  // an address no backend hands out as a stream
  return reinterpret_cast<Stream>(&sentinel);
}
inline bool is_dry(Stream s) { return s == dry_stream(); }

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
// Host to device in stream order, with no wait on other streams. From pageable memory src may be
// reused as soon as the call returns (the CUDA backend stages it): per-step inputs. From pinned
// memory (alloc_host_pinned) the copy really is asynchronous: src must stay as it is until the
// stream has passed the copy (record an event after it).
void copy_to_device_async(void* dst, const void* src, size_t bytes, Stream s);
// Device to pinned host memory (alloc_host_pinned) in stream order, asynchronous: dst holds the
// bytes once the stream has passed the copy (event_sync on an event recorded after it).
void copy_to_host_async(void* dst, const void* src, size_t bytes, Stream s);
// Page-locked host memory (CUDA: cudaMallocHost; CPU: 4096-byte aligned host memory, zeroed), for
// the asynchronous copies above and for aligned file I/O: optimizer offload (parallel/offload.cu).
// Not counted in memory_in_use (that is device memory); the caller's HostAllocator counts it.
void* alloc_host_pinned(size_t bytes);
void release_host_pinned(void* p);   // nullptr is fine
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
// Whether the work recorded before e has completed (an event never recorded is done); does not
// wait. Safe to call from another host thread (the NCCL watchdog, parallel/watchdog.h).
bool event_done(Event e);
float event_elapsed_ms(Event start, Event end);  // CPU backend: host wall time between records
const char* attention_impl_name(Stream s);        // what AttentionImpl::Auto resolved to
// The backend's own stream handle (a cudaStream_t on CUDA, nullptr on the CPU), for libraries
// that launch on it themselves (NCCL). Nothing above the seam looks inside it.
void* native_stream(Stream s);
void range_push(const char* name);        // NVTX range for profiles; no-op on the CPU
void range_pop();
// CUDA graphs (training/cuda_graph.h). Between graph_capture_begin(s) and graph_capture_end(s)
// the work queued on s - and on every stream that waited for an event recorded on s during the
// capture, which must be joined back into s the same way before the end - is recorded, not run,
// with each kernel's arguments by value; graph_launch replays it on s, in stream order. Inside a
// capture nothing may wait on the host or allocate (the capture fails at its end, naming the
// call). After a capture a stream's scratch never frees a buffer (a graph may hold it). The CPU
// backend has no graphs: graphs_supported() is false and the others stop with a message.
bool graphs_supported();
void graph_capture_begin(Stream s);
Graph graph_capture_end(Stream s);   // instantiated, ready to launch
void graph_launch(Graph g, Stream s);
void graph_destroy(Graph g);
bool stream_capturing(Stream s);     // s is inside a capture (its work is recorded, not run)

// ---------------------------------------------------------------------------------------------
// Kernels of the GPT forward and backward
// ---------------------------------------------------------------------------------------------
// out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:]            out (B,T,C), wte (Vp,C), wpe (maxT,C)
// Vocabulary-parallel form: wte holds only the rows [vocab_first, vocab_first + vocab_rows) of
// the full table; a token outside that range contributes zeros. wpe == nullptr adds no position.
// Every token must be in [0, vocab_size): the data loader checks each id on the host before any
// kernel sees it (data/dataloader.h); the CPU backend checks again and stops naming the token,
// the CUDA backend does in a build with GPT5D_DEBUG_CHECKS (make DEBUG_CHECKS=1).
// positions (B,T) int32, when given, replaces t by each token's own row of wpe (packed documents:
// positions restart at each document, model/documents.h).
void encoder_forward(void* out, const int* tokens, const void* wte, const void* wpe, int B, int T,
                     int C, DType dt, Stream s, int vocab_first = 0,
                     int vocab_rows = kAllVocabRows, int vocab_size = kAllVocabRows,
                     const int* positions = nullptr);
// dwte[tokens[b,t] - vocab_first,:] += dout[b,t,:] for tokens in the range (above);
// dwpe[t,:] += sum_b dout[b,t,:] when dwpe != nullptr (dwpe[positions[b,t],:] += dout[b,t,:]
// with positions).                                                      (deterministic order)
void encoder_backward(float* dwte, float* dwpe, const void* dout, const int* tokens, int B, int T,
                      int C, DType dt, Stream s, int vocab_first = 0,
                      int vocab_rows = kAllVocabRows, int vocab_size = kAllVocabRows,
                      const int* positions = nullptr);

// out = inp + bias + residual, summed in fp32 and rounded once. bias (C) and residual (N,C) may
// each be nullptr; out may be inp. What a GEMM epilogue does, for the row-parallel GEMMs of
// tensor parallelism, whose bias and residual must wait until the partial sums are reduced.
void add_bias_residual(void* out, const void* inp, const void* bias, const void* residual, int N,
                       int C, DType dt, Stream s);

// out = (inp - mean) * rstd * weight + bias over the last dim (eps 1e-5); mean, rstd (N) saved.
void layernorm_forward(void* out, float* mean, float* rstd, const void* inp, const void* weight,
                       const void* bias, int N, int C, DType dt, Stream s);
// dinp += dLN/dinp (dinp is the residual stream's gradient, so the residual add is fused here);
// dweight += sum_n dout * xhat;  dbias += sum_n dout.
void layernorm_backward(void* dinp, float* dweight, float* dbias, const void* dout,
                        const void* inp, const void* weight, const float* mean, const float* rstd,
                        int N, int C, DType dt, Stream s);

// ---- Llama's layers (kernels/cpu/rmsnorm.cpp, rope.cpp, swiglu.cpp; kernels/cuda/ the same) ----
// RMSNorm (Hugging Face LlamaRMSNorm): rstd[n] = 1 / sqrt(mean_c inp[n,c]^2 + eps),
// out[n,c] = inp[n,c] * rstd[n] * weight[c]; fp32 math, out rounded once to dt; rstd (N) saved.
void rmsnorm_forward(void* out, float* rstd, const void* inp, const void* weight, int N, int C,
                     float eps, DType dt, Stream s);
// dinp += dRMSNorm/dinp (dinp is the residual stream's gradient: the residual add is fused, as in
// layernorm_backward); dweight += sum_n dout * inp * rstd (fp32).
void rmsnorm_backward(void* dinp, float* dweight, const void* dout, const void* inp,
                      const void* weight, const float* rstd, int N, int C, DType dt, Stream s);
// Rotary position embeddings, in place on the q (NH heads) and k (NKV heads) of a packed qkv
// (B,T,(NH + 2 NKV) HS): row = [q heads | k heads | v heads], head h at h*HS of its part; v is
// not touched. Hugging Face's rotate_half form: for each head and j < HS/2, with
// x1 = x[j], x2 = x[j + HS/2], c = cos_table[p*HS/2 + j], s = sin_table[p*HS/2 + j]:
//   x[j] = x1 c - x2 s,   x[j + HS/2] = x2 c + x1 s          (fp32, each output rounded once)
// where p = positions[b * positions_row_stride + t] (int32 on the device: the token's global
// position in its sequence - context parallelism's zigzag chunks are not contiguous - shared by
// the B sequences with stride 0, or per token with stride T: positions inside packed documents,
// model/documents.h), or p = t when positions is nullptr.
// The tables (maxT, HS/2) fp32 are made on the host (model/rope_tables: angle = p * inv_freq[j],
// inv_freq[j] = theta^(-2j/HS), in double, then rounded), so both backends use the same bits.
void rope_forward(void* qkv, const float* cos_table, const float* sin_table, const int* positions,
                  int B, int T, int NH, int NKV, int HS, DType dt, Stream s,
                  int positions_row_stride = 0);
// Its backward, in place on the q and k gradient columns of dqkv (same layout): the rotation's
// transpose, x1' = x1 c + x2 s, x2' = x2 c - x1 s.
void rope_backward(void* dqkv, const float* cos_table, const float* sin_table,
                   const int* positions, int B, int T, int NH, int NKV, int HS, DType dt,
                   Stream s, int positions_row_stride = 0);
// SwiGLU: inp (N, 2F) holds per row [gate (F) | up (F)] (the fused gate/up GEMM's output: under
// tensor parallelism this rank's F columns of each); out (N,F) = silu(gate) * up, with
// silu(x) = x / (1 + exp(-x)), fp32 math, rounded once.
void swiglu_forward(void* out, const void* inp, int N, int F, DType dt, Stream s);
// dinp (N, 2F) is written: d gate = dout * up * silu'(gate), d up = dout * silu(gate), with
// silu'(x) = sig(x) (1 + x (1 - sig(x))). dinp must not alias inp or dout.
void swiglu_backward(void* dinp, const void* dout, const void* inp, int N, int F, DType dt,
                     Stream s);

// y = inp (N,C) @ weight(OC,C)^T [+ bias (OC)] [+ residual (N,OC)]
// pre_gelu == nullptr: out = y.   pre_gelu != nullptr: pre_gelu = y, out = gelu(y) (no residual).
void matmul_forward(void* out, void* pre_gelu, const void* inp, const void* weight,
                    const void* bias, const void* residual, int N, int C, int OC, DType dt,
                    Stream s);
// dinp = dout (N,OC) @ weight (OC,C), times gelu'(gelu_input) when gelu_input (N,C) is given
//        (the GELU that produced inp, fused); dinp may be nullptr (not needed).
// dweight += dout^T @ inp (fp32);  dbias += sum_n dout (fp32). Each when given: a backward split
// in two (zero-bubble pipeline schedules) calls it with dinp alone (inp is then not read), then
// with dweight and dbias alone (weight and gelu_input are then not read).
void matmul_backward(void* dinp, float* dweight, float* dbias, const void* dout, const void* inp,
                     const void* weight, const void* gelu_input, int N, int C, int OC, DType dt,
                     Stream s);

// Grouped linear layers: `groups` layers side by side (a rank's experts), each over its own
// consecutive block of rows of one activation. Group g owns rows[g] rows (host array; 0 allowed),
// starting at the sum of the rows before it, and its own weight (OC,C) at weight + g*OC*C (bias
// + g*OC; dweight + g*OC*C, dbias + g*OC). Per group the contracts of matmul_forward (no
// residual) and matmul_backward. The CPU backend loops over matmul_*; the CUDA backend runs each
// GEMM of all groups in one launch, the counts passed as kernel arguments (no copy, no sync).
void grouped_matmul_forward(void* out, void* pre_gelu, const void* inp, const void* weight,
                            const void* bias, const int* rows, int groups, int C, int OC,
                            DType dt, Stream s);
void grouped_matmul_backward(void* dinp, float* dweight, float* dbias, const void* dout,
                             const void* inp, const void* weight, const void* gelu_input,
                             const int* rows, int groups, int C, int OC, DType dt, Stream s);

// GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
void gelu_forward(void* out, const void* inp, size_t n, DType dt, Stream s);
// dinp = dout * gelu'(inp); dinp may alias dout.
void gelu_backward(void* dinp, const void* inp, const void* dout, size_t n, DType dt, Stream s);

// Causal self-attention, grouped-query (GQA): NH query heads share NKV key/value heads (NKV
// divides NH; NKV = NH is plain multi-head attention, GPT-2's). Packed qkv (B,T,(NH+2NKV)HS) is
// [q heads | k heads | v heads]: q of head h at columns h*HS, k of kv head g at NH*HS + g*HS, v at
// (NH+NKV)*HS + g*HS. Query head h attends with kv head h / (NH/NKV) (kv heads are read, never
// copied). out (B,T,C), C = NH*HS, with head h at columns h*HS; lse (B,NH,T) fp32 is each query
// row's log-sum-exp of the scaled scores (natural log), which ring attention needs to merge
// blocks. Scores are scaled by 1/sqrt(HS). No (T,T) matrix is ever stored.
// Packed documents (model/documents.h): docs (B,T) int32, each token's document index in its
// sequence, non-decreasing along it; query i then sees key j iff j <= i and docs agree (a
// block-causal mask), and kernels skip the tiles it masks whole. docs == nullptr: plain causal.
void attention_forward(void* out, float* lse, const void* qkv, int B, int T, int NH, int NKV,
                       int HS, DType dt, Stream s, const int* docs = nullptr);
// dqkv (B,T,(NH+2NKV)HS) is written (not accumulated); dk, dv of a kv head are the sums over its
// NH/NKV query heads.
void attention_backward(void* dqkv, const void* dout, const void* qkv, const void* out,
                        const float* lse, int B, int T, int NH, int NKV, int HS, DType dt,
                        Stream s, const int* docs = nullptr);
// Ring attention's merge (parallel/context_parallel_plan.h): folds a partial attention result
// over one block of keys, out_b (B,T,C) with its log-sum-exp lse_b (B,NH,T), into the result
// accumulated over other, disjoint keys, out (B,T,C) and lse (B,NH,T), in place. For every
// (b, t, head h), with hi = max(lse, lse_b) and lo = min(lse, lse_b):
//   lse_new = hi + log1p(exp(lo - hi))                     (= log(exp(lse) + exp(lse_b)), stably)
//   out     = out * exp(lse - lse_new) + out_b * exp(lse_b - lse_new)   over columns h*HS..+HS
//   lse     = lse_new
// The two weights are computed from the difference alone, e = exp(lo - hi): the larger side
// weighs 1/(1 + e), the smaller e/(1 + e) (the same numbers, without rounding lse_new first).
// An empty block (lse_b = -inf) leaves the row alone; an empty accumulator (lse = -inf) takes
// out_b and lse_b as they are (whatever out held); both -inf: unchanged. No NaN from -inf.
// out, out_b in dt (fp32 or bf16), math in fp32, out rounded once; lse, lse_b fp32, natural log,
// as attention_forward writes them. out_b and lse_b are only read.
void attention_merge(void* out, float* lse, const void* out_b, const float* lse_b, int B, int T,
                     int NH, int HS, DType dt, Stream s);
// Ring attention's block (parallel/context_parallel.cu): the T queries of each of B sequences,
// from the packed qkv (B,T,(NH+2NKV)HS) (q of head h at columns h*HS, as attention_forward's),
// against T keys and values of another block, from a packed kv (B,T,2 NKV HS) (k of kv head g at
// columns g*HS, v at (NKV+g)*HS). Query head h uses kv head h / (NH/NKV).
// causal: the two blocks are one chunk (key j visible to query i iff j <= i); else every key is
// visible. Writes this block's own output out (B,T,C) and log-sum-exp lse (B,NH,T) (natural log
// of the scaled scores), which attention_merge folds into the running ones. C = NH*HS.
// Packed documents: q_docs and k_docs (B,T) int32, the document ids of the two blocks' tokens
// (numbered along the whole sequence, so non-decreasing within a block and from an earlier block
// to a later one); key j is then visible only if its id equals the query's. A query that sees no
// key of the block gets out = 0 and lse = -inf (attention_merge leaves it alone). Both null:
// no document mask.
void attention_block_forward(void* out, float* lse, const void* qkv, const void* kv, int B, int T,
                             int NH, int NKV, int HS, bool causal, DType dt, Stream s,
                             const int* q_docs = nullptr, const int* k_docs = nullptr);
// Its backward, given the final output out (B,T,C) and log-sum-exp lse (B,NH,T) of these queries
// over every block (after all merges) and dout (B,T,C): accumulates (+=, fp32) the block's
// contribution to dq (B,T,C) and to dkv (B,T,2 NKV HS) (dk of kv head g at columns g*HS, dv at
// (NKV+g)*HS; each the sum over the kv head's NH/NKV query heads).
void attention_block_backward(float* dq, float* dkv, const void* dout, const void* out,
                              const float* lse, const void* qkv, const void* kv, int B, int T,
                              int NH, int NKV, int HS, bool causal, DType dt, Stream s,
                              const int* q_docs = nullptr, const int* k_docs = nullptr);
// Sampling with a KV cache (model/kv_cache.h): the attention of n new tokens of one sequence,
// at positions pos .. pos+n-1, against the cached keys and values of positions 0 .. pos+n-1.
// qkv (n,(NH+2NKV)HS) packed as attention_forward's (its k, v already copied into the cache);
// cache (pos+n, 2 NKV HS) rows [k heads | v heads] (k of kv head g at columns g*HS, v at
// (NKV+g)*HS, as attention_block_forward's kv). Query i sees cache rows 0 .. pos+i; query head h
// uses kv head h / (NH/NKV). out (n, NH*HS), math in fp32, rounded once to dt. Prefill is n =
// the prompt's length at pos 0; each step after is n = 1. No lse (forward only).
void attention_cached_forward(void* out, const void* qkv, const void* cache, int n, int pos,
                              int NH, int NKV, int HS, DType dt, Stream s);
// Strided column copy with a cast: for r < rows, j < width:
//   dst[r * dst_cols + j] = src[r * src_cols + j]   (src_dt -> dst_dt, rounded to nearest even)
// The caller offsets dst and src to the first column (ring attention: k,v out of qkv; dq, dk, dv
// into dqkv).
void copy_columns(void* dst, int dst_cols, DType dst_dt, const void* src, int src_cols,
                  DType src_dt, int rows, int width, Stream s);

// The classifier, one pass per row over logits (N,Vp): softmax over the first V columns,
// losses[n] = -log p[targets[n]]. If dloss != 0 the logits are overwritten in place with the
// gradient of (dloss * sum_n losses[n]): (p - onehot) * dloss for columns < V, 0 for the padded
// ones. A target < 0 is ignored (loss 0, gradient row 0). Probabilities are never stored.
void classifier_forward_backward(void* logits, float* losses, const int* targets, float dloss,
                                 int N, int V, int Vp, DType dt, Stream s);
// The same classifier over a vocabulary shard (tensor parallelism): logits (N, Vs) are the
// columns [col0, col0 + Vs) of the full (N, Vp) logits; columns >= V are padding. Three steps,
// with the communication of a few floats per row between the first two:
//   1. classifier_shard_stats: per row of this shard, stats (N,3) fp32 = {max over its valid
//      columns (-inf if it has none), sum of exp(x - that max), the target's logit if the target
//      lies in this shard else 0}.
//   2. classifier_merge_stats: parts_stats (parts, N, 3) holds every shard's stats in shard
//      order (an all-gather); writes the global stats (N,3) = {max M, sum of exp(x - M), target
//      logit} and losses[n] = M + log(sum) - target logit. Every rank merges in the same order,
//      so all ranks hold the same losses bit for bit.
//   3. classifier_shard_backward (if training): the shard's logits become the gradient of
//      dloss * sum_n losses[n]: (exp(x - M) / sum - onehot) * dloss on valid columns, 0 on
//      padding. A target < 0 is ignored (loss 0, gradient 0), as above.
void classifier_shard_stats(float* stats, const void* logits, const int* targets, int N, int Vs,
                            int col0, int V, DType dt, Stream s);
void classifier_merge_stats(float* stats, float* losses, const float* parts_stats,
                            const int* targets, int parts, int N, Stream s);
void classifier_shard_backward(void* logits, const float* stats, const int* targets, float dloss,
                               int N, int Vs, int col0, int V, DType dt, Stream s);

// ---------------------------------------------------------------------------------------------
// Mixture of experts: the router (kernels/cpu/moe_router.cpp, kernels/cuda/moe_router.cu)
// ---------------------------------------------------------------------------------------------
// The router's logits z (N,E) = x W_r^T come from matmul_forward (fp32 out); everything here is
// fp32. E experts, each token chooses top_k of them (1 <= top_k <= E).
enum class RouterScore { Softmax = 0, Sigmoid = 1 };  // [model] router_score
//
// moe_router_forward, per token row n:
//   lse[n]      = logsumexp(z[n,:])                   (for the z-loss, mean_n lse^2)
//   probs[n,e]  = p_e = exp(z[n,e] - lse[n])          (softmax over all E; saved for backward)
//   expert[n,j] = the top_k experts by p, in decreasing p; a tie goes to the lower index. The
//                 choice is made on z, which orders the experts as p does (softmax is monotonic)
//                 but without p's rounding: so both backends choose alike, ties are exact ties of
//                 z, and the choice is the one float64 arithmetic would make.
//   gate[n,j]   = p_{expert[n,j]} / S with S = sum_j p_{expert[n,j]} (summed in slot order)
//                 when top_k > 1; the raw p_{expert[n,0]} when top_k == 1.
//
// score = Sigmoid (DeepSeek-V3's router): probs[n,e] = p_e = 1 / (1 + exp(-z[n,e])) instead,
// lse as above (the z-loss stays on the logits), and the gates the same formulas on these p.
// choice_bias (E, nullptr: none; model/moe.cu's balancing biases b): the top_k are chosen by
// p_e + b_e instead (decreasing, ties to the lower index); the gates stay the unbiased p.
void moe_router_forward(const float* logits, int N, int E, int top_k, int* expert, float* gate,
                        float* probs, float* lse, Stream s,
                        RouterScore score = RouterScore::Softmax,
                        const float* choice_bias = nullptr);
// dlogits (N,E) is written: the gradient of
//   L = sum_{n,j} dgate[n,j] * gate[n,j]  +  sum_{n,e} dprobs_aux[n,e] * p[n,e]
//       + z_coef * sum_n lse[n]^2
// with respect to z, where dgate (N,top_k) is the gradient of the loss w.r.t. the gates,
// dprobs_aux (N,E) the gradient of the load-balancing loss w.r.t. p (nullptr: none) and z_coef
// the z-loss coefficient per token (coefficient / N for a mean; 0: no z-loss). dprobs_aux comes
// from the MoE layer (model/moe.cu, `balance`), which computes the balance gradient on the host:
// a sequence may be split over context-parallel and sequence-parallel ranks, whose expert counts
// are summed first; per token t of sequence s (T positions, `sequences` in the global batch),
//   dprobs_aux[t,e] = aux_coef * E * f_{s,e} / (T * sequences),
//   f_{s,e} = (slots (t, j) of s with expert[t,j] == e) / (T * top_k)
// (test/test_moe_router.py checks this formula against autograd of the balance loss). The choice
// of experts is piecewise constant: it has no gradient. Per row, with e_j = expert[n,j]:
//   gradient w.r.t. p, dp (E):
//     dp_e  = dprobs_aux[n,e]                                     (0 without it), and then
//     top_k == 1: dp_{e_0} += dgate_0
//     top_k  > 1: dp_{e_i} += (dgate_i - G) / S,  S = sum_j p_{e_j},  G = sum_j dgate_j gate_j
//                 (from gate_i = p_{e_i} / S: d gate_i / d p_{e_m} = (delta_im - gate_i) / S)
//   through the softmax and the z-loss (d lse / d z_e = p_e):
//     dlogits_e = p_e * (dp_e - sum_f p_f dp_f)  +  2 * z_coef * lse * p_e
// score = Sigmoid: the same dp, then through each sigmoid and the z-loss on the logits z (N,E),
// which it then reads (nullptr with Softmax):
//     dlogits_e = dp_e * p_e * (1 - p_e)  +  2 * z_coef * lse * exp(z_e - lse)
void moe_router_backward(float* dlogits, const float* probs, const int* expert, const float* gate,
                         const float* dgate, const float* dprobs_aux, const float* lse,
                         float z_coef, int N, int E, int top_k, Stream s,
                         RouterScore score = RouterScore::Softmax,
                         const float* logits = nullptr);

// ---------------------------------------------------------------------------------------------
// Mixture of experts: moving tokens (kernels/cpu/moe_dispatch.cpp, kernels/cuda/moe_dispatch.cu)
// ---------------------------------------------------------------------------------------------
// The indices come from the dispatch plan (parallel/expert_dispatch_plan.h), uploaded as int32
// device arrays: N tokens of C channels, top_k slots each; pair p = n*top_k + j is slot j of
// token n; order (N*top_k) lists the pairs in expert order (row i of the dispatch buffer holds
// pair order[i]) and position is its inverse (pair p sits in row position[p]). Activations
// (in, out, expert_out, dout, din, d_expert_out) are (rows, C) in dt, fp32 or bf16; gates and
// their gradient are fp32 (N*top_k), as moe_router_forward writes them. Every output element is
// computed by one thread from a fixed list in a fixed order (no atomics): the same bits on every
// run and thread count. Outputs are written, not accumulated, and must not overlap the inputs.
// A pair dropped by the capacity (model/moe.cu) has position[p] = -1 and no row: the combine
// leaves it out of its sum, its d_gate is 0, and the unpermute's backward leaves it out too.
// The combine's weighted sums are fused multiply-adds (fmaf, __fmaf_rn), so the two backends
// agree to the bit on everything but d_gate's dot products.
//
// The dispatch, a row gather (a copy, no rounding): out (M,C)
//   out[i,:] = in[rows[i],:]                                            for i < M
// With the plan: M = N*top_k and rows[i] = order[i] / top_k, the token of pair order[i].
void moe_permute(void* out, const void* in, const int* rows, int M, int C, DType dt, Stream s);
// The backward of that dispatch: the gradient dout (N*top_k, C) of the dispatch buffer, in
// expert order, back to token order ("unpermuted"), each token summing its top_k copies:
//   din[n,:] = sum_{j < top_k} dout[position[n*top_k + j], :]          din (N,C), written
// summed in fp32 in j order and rounded once to dt. position is the plan's (the inverse of the
// order that made rows): a token's rows are listed by its pairs, so no scatter and no atomics.
void moe_unpermute_backward(void* din, const void* dout, const int* position, int N, int top_k,
                            int C, DType dt, Stream s);
// The combine: each token's expert outputs, weighted by its gates. expert_out (N*top_k, C) is in
// dispatch (expert) order; out (N,C) is written:
//   out[n,:] = sum_{j < top_k} gate[p] * expert_out[position[p], :],    p = n*top_k + j
// in fp32, in j order, as acc = fma(gate[p], x, acc) from acc = 0; rounded once to dt.
void moe_combine(void* out, const void* expert_out, const float* gate, const int* position, int N,
                 int top_k, int C, DType dt, Stream s);
// Its backward, given dout (N,C), the gradient of out. Both outputs are written; with position a
// permutation of [0, N*top_k) every row of d_expert_out is written once:
//   d_expert_out[position[p], :] = gate[p] * dout[n, :]     (fp32 product, rounded once to dt)
//   d_gate[p] = sum_c dout[n, c] * expert_out[position[p], c]      (fp32)
// for p = n*top_k + j. The dot product's order is the backend's own (CPU: column order; CUDA: a
// fixed reduction tree), deterministic on each but not bitwise equal between the two.
void moe_combine_backward(void* d_expert_out, float* d_gate, const void* dout,
                          const void* expert_out, const float* gate, const int* position, int N,
                          int top_k, int C, DType dt, Stream s);

// ---------------------------------------------------------------------------------------------
// FP8 GEMMs (model/fp8.h drives them; formats and rounding in kernels/fp8.h)
// ---------------------------------------------------------------------------------------------
bool device_supports_fp8();  // FP8 tensor cores (sm_89+); the CPU emulates them: true
// *amax = max_i |x[i]| (0 when n == 0), fp32 on the device. NaN propagates.
void amax(float* amax, const void* x, size_t n, DType dt, Stream s);
// The scale of the next cast, on the device (no host sync). With history_len == 0 (current,
// "tensorwise" scaling) from *amax; otherwise ("delayed") from the largest amax in history
// (history_len floats, newest first; all zero at the start: then *amax), after which history
// rolls by one and history[0] = *amax. scale = fp8_max / a / 2^margin for a finite a > 0, else
// 1; scale_inv = 1 / scale (what the GEMM multiplies by to undo it).
void fp8_update_scale(float* scale, float* scale_inv, float* history, int history_len,
                      const float* amax, float fp8_max, int margin, Stream s);
// out (rows x cols, FP8 format `fp8`) = x * (*scale), rounded to nearest even and saturated
// (kernels/fp8.h); if out_t is given it receives the same values transposed (cols x rows), the
// layout Hopper's FP8 GEMM wants for the other two GEMMs of a linear layer. Either output may be
// nullptr (not both): the backward needs some tensors only transposed.
void fp8_cast(void* out, void* out_t, DType fp8, const void* x, DType dt, int rows, int cols,
              const float* scale, Stream s);
// out (M x N, row-major, dtype out_dt: F32 or BF16) = (a (M x K) @ b (N x K)^T) * (*a_scale_inv)
// * (*b_scale_inv), both operands FP8 and K-contiguous, products accumulated in fp32. With
// accumulate, out += instead (out_dt F32: weight gradients).
void gemm_fp8(void* out, DType out_dt, bool accumulate, const void* a, DType a_fp8,
              const void* b, DType b_fp8, int M, int N, int K, const float* a_scale_inv,
              const float* b_scale_inv, Stream s);
// Block-scaled FP8 (the rowwise, blockwise and mxfp8 recipes, model/fp8.h). The logical matrix X
// is x (rows x cols) or, with transpose, x^T (cols x rows). Each block_rows x block_cols block of
// X (edge blocks partial: as if X were padded with zeros) gets a power-of-two scale from its own
// amax (kernels/fp8.h fp8_block_scale_inv: e8m0 picks the MX rule, else the power-of-two rule with
// `margin`); out (X's shape, row-major) = X * scale of its block, rounded as fp8_cast rounds, and
// scale_inv[bi * ceil(X cols / block_cols) + bj] = 1 / scale of block (bi, bj).
void fp8_cast_blocks(void* out, float* scale_inv, DType fp8, const void* x, DType dt, int rows,
                     int cols, bool transpose, int block_rows, int block_cols, bool e8m0,
                     int margin, Stream s);
// out (M x N, F32 with accumulate "+=", or BF16) = A . B^T, A (M x K) and B (N x K) the decoded
// block-scaled operands (code * scale_inv of its block, layouts as fp8_cast_blocks writes them),
// products summed in fp32. workspace: (M + N) * K * 2 bytes (the CUDA backend dequantises the
// operands into it as bf16 - exact, the scales being powers of two - and runs the bf16 GEMM; the
// CPU backend does not use it).
void gemm_fp8_blocks(void* out, DType out_dt, bool accumulate, const void* a, DType a_fp8,
                     const float* a_scale_inv, int a_block_rows, int a_block_cols, const void* b,
                     DType b_fp8, const float* b_scale_inv, int b_block_rows, int b_block_cols,
                     int M, int N, int K, void* workspace, Stream s);

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
// The step's scalars from every rank's part, on the device (one thread; the host never waits):
// the n parts (rank order) converted to double and added in that order. Exactly the host's
// MPI sum of the same doubles: n floats of one magnitude add up exactly in double, in any order.
//   sum_parts:          *out = (sum of the parts) / divisor            (the mean loss)
//   grad_norm_and_clip: *norm = sqrt(sum of the parts)                 (the gradient norm), and
//                       *factor = PyTorch's clip_grad_norm_ factor in double, rounded to float:
//                       grad_clip / (*norm + 1e-6) when that is below 1, else 1 (grad_clip <= 0:
//                       always 1; a NaN norm gives 1 and an infinite one 0, as the comparison
//                       falls)
void sum_parts(double* out, const float* parts, int n, double divisor, Stream s);
void grad_norm_and_clip(double* norm, float* factor, const float* parts, int n, float grad_clip,
                        Stream s);
// dst[i] += src[i]
void add_inplace(float* dst, const float* src, size_t n, Stream s);
// dbias (OC) += sum_n dout[n, :] (fp32), dout (N, OC): the bias gradient alone.
void bias_backward(float* dbias, const void* dout, int N, int OC, DType dt, Stream s);
// dst = src converted (rounded to nearest even when narrowing).
void cast(void* dst, DType dst_dt, const void* src, DType src_dt, size_t n, Stream s);

// DiLoCo's outer step (parallel/diloco.h), fp32, elementwise over n values, every product and sum
// rounded once in this order (no FMA), so that both backends agree bit for bit:
//   diloco_outer_delta: delta[i] = sync[i] - weights[i]
//   diloco_outer_step:  g = delta_sum[i] * inv_islands; m[i] = mu * m[i] + g;
//                       sync[i] = sync[i] - lr * (g + mu * m[i]); weights[i] = sync[i]
void diloco_outer_delta(float* delta, const float* sync, const float* weights, size_t n,
                        Stream s);
void diloco_outer_step(float* sync, float* m, float* weights, const float* delta_sum, size_t n,
                       float inv_islands, float lr, float mu, Stream s);

// ---------------------------------------------------------------------------------------------
// Compressed gradient reductions (parallel/grad_compression.cu), fp32 in and out
// ---------------------------------------------------------------------------------------------
// Int8 block quantisation of `chunks` chunks of chunk_n values (x, chunks * chunk_n floats). Each
// chunk is cut into blocks of kQuantBlock values from its own start (the last block of a chunk
// may be shorter). Per block: scale = absmax / 127 in fp32 (0 for an all-zero block); per value
// q = rint(x / scale) (nearest even; 0 when the scale is 0), kept in [-127, 127]. Chunk c becomes
// one record at packed + c * int8_record_bytes(chunk_n): its chunk_n codes, zero bytes up to a
// multiple of 4, then its blocks' scales. The quantisation error err[i] = x[i] - q[i] * scale
// (each product and difference rounded once, no FMA) is written, or added with accumulate_err;
// err may be x itself.
void int8_quantize(void* packed, float* err, const float* x, size_t chunk_n, int chunks,
                   bool accumulate_err, Stream s);
// out[i] = (...((0 + d_0[i]) + d_1[i]) + ...) + d_{records-1}[i] for i < chunk_n, where
// d_r[i] = q_r[i] * scale_r: the sum of `records` records of one chunk, in record order, fp32.
void int8_dequantize_sum(float* out, const void* packed, size_t chunk_n, int records, Stream s);
// The records of consecutive chunks, end to end: out[c * chunk_n + i] = q_c[i] * scale_c for
// every element below n (records * chunk_n may exceed n: the rest is not written).
void int8_dequantize(float* out, size_t n, const void* packed, size_t chunk_n, int records,
                     Stream s);
// Top-k sparsification: the k values of x (n floats, k <= n) with the largest |x|, where equal
// magnitudes go by the lower index first (|x| compared as the bits of the float without its
// sign). record receives their k indices in increasing order (int32), then their k values; the
// selected values of x are set to 0, so that x keeps what was not sent. scratch:
// topk_scratch_bytes(n) bytes of device memory.
void topk_select(int32_t* record, float* x, size_t n, size_t k, void* scratch, Stream s);
// For each of `records` records (k indices, then k values, as topk_select writes them) in record
// order: out[i - first] += value for each index i in [first, first + out_n).
void topk_scatter_add(float* out, size_t first, size_t out_n, const int32_t* records, size_t k,
                      int records_n, Stream s);

}  // namespace ops
