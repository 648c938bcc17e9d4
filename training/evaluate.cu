// training/evaluate.cu - the validation loss (training/evaluate.h). Samples are
// training/sample.cu's.
#include "training/evaluate.h"

#include "model/documents.h"
#include "parallel/context_parallel.h"

#include <cmath>
#include <vector>

double last_stage_mean(const GPT& m, Comm& world, double local, int dp) {
  const bool counts = gpt_holds_output(m) && m.layout.tp.rank() == 0;  // tp ranks hold copies
  return all_reduce_host_sum(world, counts ? local : 0.0) / dp;
}

DocumentBatch documents_of(const GPT& m, const int* tokens, int B, int T) {
  if (!m.document_mask) return {};
  return document_batch(tokens, B, T, m.eot_token, m.layout.cp->size, m.layout.cp->rank);
}
const int* docs_or_null(const GPT& m, const std::vector<int>& v) {
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
