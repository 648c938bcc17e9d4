// training/evaluate.cu - the validation loss (training/evaluate.h). Samples are
// training/sample.cu's.
#include "training/evaluate.h"

#include "parallel/context_parallel.h"

#include <cmath>
#include <vector>

double last_stage_mean(const GPT& m, Comm& world, double local, int dp) {
  const bool counts = gpt_holds_output(m) && m.layout.tp.rank() == 0;  // tp ranks hold copies
  return all_reduce_host_sum(world, counts ? local : 0.0) / dp;
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
    gpt_pipeline_forward(m, store, pl, {local_in.data(), local_tg.data(), 1, B, Tl}, s);
    if (gpt_holds_output(m))
      ops::sum_accumulate(m.loss_sum, m.losses, (size_t)B * Tl, 1.0f / ((float)B * T * batches),
                          s);
  }
  float local = 0;
  ops::stream_sync(s);
  ops::copy_to_host(&local, m.loss_sum, sizeof(float));
  return last_stage_mean(m, world, local, dp);
}
