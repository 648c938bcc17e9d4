// training/evaluate.cu - validation loss and sampling (training/evaluate.h).
//
// Sampling runs the full forward over a window of T tokens for every new token (no KV cache):
// simple, and cheap next to training. Positions after the current length hold end-of-text
// tokens; causal attention keeps them from influencing the position we read.
#include "training/evaluate.h"

#include "model/documents.h"
#include "parallel/context_parallel.h"

#include <cmath>
#include <random>
#include <vector>

double last_stage_mean(const GPT& m, Comm& world, double local, int dp) {
  const bool counts = gpt_holds_output(m) && m.layout.tp.rank() == 0;  // tp ranks hold copies
  return all_reduce_host_sum(world, counts ? local : 0.0) / dp;
}

// [data] document_mask: the documents of B full rows of T tokens for this rank (else empty).
static DocumentBatch documents_of(const GPT& m, const int* tokens, int B, int T) {
  if (!m.document_mask) return {};
  return document_batch(tokens, B, T, m.eot_token, m.layout.cp->size, m.layout.cp->rank);
}
static const int* docs_or_null(const GPT& m, const std::vector<int>& v) {
  return m.document_mask ? v.data() : nullptr;
}

double validation_loss(GPT& m, ParamStore& store, const Pipeline& pl, DataLoader& val,
                       int batches, Comm& world, int dp, ops::Stream s) {
  const int B = val.B, T = val.T, cp = m.layout.cp->size, Tl = T / cp;
  std::vector<int> inputs((size_t)B * T), targets((size_t)B * T);
  std::vector<int> local_in((size_t)B * Tl), local_tg((size_t)B * Tl);
  dataloader_reset(val);
  ops::fill_zero(m.loss_sum, sizeof(float), s);
  for (int i = 0; i < batches; i++) {
    dataloader_next(val, inputs.data(), targets.data());
    cp_select_tokens(local_in.data(), inputs.data(), cp, m.layout.cp->rank, B, T);
    cp_select_tokens(local_tg.data(), targets.data(), cp, m.layout.cp->rank, B, T);
    const DocumentBatch d = documents_of(m, inputs.data(), B, T);
    gpt_pipeline_forward(m, store, pl, {local_in.data(), local_tg.data(), 1, B, Tl,
                                        docs_or_null(m, d.ids), docs_or_null(m, d.positions)},
                         s);
    if (gpt_holds_output(m))
      ops::sum_accumulate(m.loss_sum, m.losses, (size_t)B * Tl, 1.0f / ((float)B * T * batches),
                          s);
  }
  float local = 0;
  ops::stream_sync(s);
  ops::copy_to_host(&local, m.loss_sum, sizeof(float));
  return last_stage_mean(m, world, local, dp);
}

// u01: a uniform draw in [0, 1), made on every rank whether it samples or not, so that the
// generator stays the same on all of them.
static int sample_from_logits(const std::vector<float>& logits, double u01) {
  double maxv = logits[0];
  for (float x : logits) maxv = std::max(maxv, (double)x);
  std::vector<double> p(logits.size());
  double sum = 0;
  for (size_t j = 0; j < logits.size(); j++) sum += p[j] = std::exp(logits[j] - maxv);
  double u = u01 * sum;
  for (size_t j = 0; j < p.size(); j++)
    if ((u -= p[j]) <= 0) return (int)j;
  return (int)p.size() - 1;
}

std::string sample_text(GPT& m, ParamStore& store, const Pipeline& pl, Comm& pp,
                        const Tokenizer& tok, int eot, int n, uint64_t seed, int T,
                        ops::Stream s) {
  Comm& cp = *m.layout.cp;
  std::vector<int> local(T / cp.size);
  std::mt19937_64 rng(seed);
  std::vector<int> generated{eot};
  std::vector<int> window(T);
  for (int i = 0; i < n; i++) {
    const int len = std::min((int)generated.size(), T);
    for (int t = 0; t < T; t++) window[t] = t < len ? generated[generated.size() - len + t] : eot;
    cp_select_tokens(local.data(), window.data(), cp.size, cp.rank, 1, T);
    const DocumentBatch d = documents_of(m, window.data(), 1, T);
    // The last stage's cp rank holding position len-1 samples (its head keeps that row's
    // logits); control plane (one token id): to the other cp ranks of the last stage, then from
    // the last stage to the others.
    int next = 0, owner = 0;
    for (int r = 0; r < cp.size; r++)
      if (cp_local_index(cp.size, r, 1, T, 0, len - 1) >= 0) owner = r;
    const int row = cp_local_index(cp.size, cp.rank, 1, T, 0, len - 1);
    m.logits_row = row;
    gpt_pipeline_forward(m, store, pl, {local.data(), nullptr, 1, 1, T / cp.size,
                                        docs_or_null(m, d.ids), docs_or_null(m, d.positions)},
                         s);
    m.logits_row = -1;
    const double u01 = std::uniform_real_distribution<double>(0.0, 1.0)(rng);
    if (gpt_holds_output(m) && row >= 0) next = sample_from_logits(gpt_logits_row(m, s), u01);
    if (gpt_holds_output(m)) broadcast_host(cp, &next, sizeof(next), owner);
    broadcast_host(pp, &next, sizeof(next), pl.schedule.owner(pl.schedule.p * pl.schedule.v - 1));
    generated.push_back(next);
  }
  return tokenizer_decode(tok, generated.data() + 1, (int)generated.size() - 1);
}
