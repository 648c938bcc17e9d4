// model/documents.h - packed documents ([data] document_mask): where each document of a row
// starts, for block-causal attention and for positions that restart at each document.
//
// Pre-training packs documents into fixed-length rows; llm.c's shards put an end-of-text token
// ([data] eot_token) before every document. With document_mask a document starts at each
// end-of-text token (the token belongs to the document it starts), and a row that begins in the
// middle of a document treats its first token as a start. A token attends only to earlier tokens
// of its own document (block-causal attention; Megatron's packed THD layout, torchtitan's
// block_causal), so the loss of a row is the sum of its documents' losses as if each were alone.
//
// Two int32 arrays per micro-batch, made on the host from the full rows (every cp rank's
// positions), uploaded to every pipeline stage with the micro-batch (model/gpt.h):
//   ids        the document index of each token inside its row: 0 for the first token, +1 at
//              each later end-of-text token, so non-decreasing along the row. The attention
//              kernels (kernels/ops_decls.h) let query i see key j iff ids agree and j <= i.
//              Layout: the rows' chunks, chunk-major, (chunks, B, T/chunks) - one chunk (B,T)
//              without context parallelism, the 2cp zigzag chunks with it, so that ring
//              attention finds the ids of any chunk's B rows as one contiguous (B, Tc) block.
//   positions  each of this rank's tokens' position inside its document (t - start of its
//              document), in the rank's local token order (cp_select_tokens': chunk-major): the
//              RoPE angle (Llama) or the row of wpe (GPT-2) when [data] document_positions.
// Bytes: 4 B T (ids) + 4 B T / cp (positions) per micro-batch, host to device, on every stage.
#pragma once
#include <vector>

// The documents of one micro-batch of B rows of T tokens (the full rows, every cp rank's).
struct DocumentBatch {
  std::vector<int> ids;        // (chunks, B, T/chunks): chunks = 1, or 2cp under cp > 1
  std::vector<int> positions;  // (B*T/cp) this cp rank's tokens, local order
};

// The document ids and positions of `tokens` (B,T) for cp rank `cp_rank` of `cp`.
DocumentBatch document_batch(const int* tokens, int B, int T, int eot, int cp, int cp_rank);

// Each row's document lengths, in order (the MFU count: attention FLOPs are the sum over
// documents of L^2, training/metrics.h).
std::vector<int> document_lengths(const int* tokens, int B, int T, int eot);
