// model/evaluate.cu - validation loss and sampling (model/evaluate.h).
//
// Sampling runs the full forward over a window of T tokens for every new token (no KV cache):
// simple, and cheap next to training. Positions after the current length hold end-of-text
// tokens; causal attention keeps them from influencing the position we read.
#include "model/evaluate.h"

#include <cmath>
#include <random>
#include <vector>

double last_stage_mean(const GPT& m, Comm& world, double local, int dp) {
  const bool counts = gpt_holds_output(m) && m.layout.tp.rank == 0;  // tp ranks hold copies
  return all_reduce_host_sum(world, counts ? local : 0.0) / dp;
}

double validation_loss(GPT& m, ParamStore& store, const Pipeline& pl, DataLoader& val,
                       int batches, Comm& world, int dp, ops::Stream s) {
  const int B = val.B, T = val.T;
  std::vector<int> inputs((size_t)B * T), targets((size_t)B * T);
  dataloader_reset(val);
  ops::fill_zero(m.loss_sum, sizeof(float), s);
  for (int i = 0; i < batches; i++) {
    dataloader_next(val, inputs.data(), targets.data());
    gpt_pipeline_forward(m, store, pl, {inputs.data(), targets.data(), 1, B, T}, s);
    if (gpt_holds_output(m))
      ops::sum_accumulate(m.loss_sum, m.losses, (size_t)B * T, 1.0f / ((float)B * T * batches),
                          s);
  }
  float local = 0;
  ops::stream_sync(s);
  ops::copy_to_host(&local, m.loss_sum, sizeof(float));
  return last_stage_mean(m, world, local, dp);
}

static int sample_from_logits(const std::vector<float>& logits, std::mt19937_64& rng) {
  double maxv = logits[0];
  for (float x : logits) maxv = std::max(maxv, (double)x);
  std::vector<double> p(logits.size());
  double sum = 0;
  for (size_t j = 0; j < logits.size(); j++) sum += p[j] = std::exp(logits[j] - maxv);
  double u = std::uniform_real_distribution<double>(0.0, sum)(rng);
  for (size_t j = 0; j < p.size(); j++)
    if ((u -= p[j]) <= 0) return (int)j;
  return (int)p.size() - 1;
}

std::string sample_text(GPT& m, ParamStore& store, const Pipeline& pl, Comm& pp,
                        const Tokenizer& tok, int eot, int n, uint64_t seed, ops::Stream s) {
  const int T = m.T;
  std::mt19937_64 rng(seed);
  std::vector<int> generated{eot};
  std::vector<int> window(T);
  for (int i = 0; i < n; i++) {
    const int len = std::min((int)generated.size(), T);
    for (int t = 0; t < T; t++) window[t] = t < len ? generated[generated.size() - len + t] : eot;
    gpt_pipeline_forward(m, store, pl, {window.data(), nullptr, 1, 1, T}, s);
    int next = 0;
    if (gpt_holds_output(m)) next = sample_from_logits(gpt_logits_row(m, len - 1, s), rng);
    if (pp.size > 1)  // control plane: one token id from the last stage to the others
      MPI_Bcast(&next, 1, MPI_INT, pp.size - 1, pp.mpi);
    generated.push_back(next);
  }
  return tokenizer_decode(tok, generated.data() + 1, (int)generated.size() - 1);
}
