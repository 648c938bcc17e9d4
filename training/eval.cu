// training/eval.cu - multiple-choice evaluation (training/eval.h).
//
// Bytes: per forward, B rows of seq_len token ids and targets up, B x seq_len/cp losses down
// (last stage); one all-reduce of 8 bytes per (example, ending) at the end.
#include "training/eval.h"

#include <algorithm>

#include "parallel/context_parallel.h"

namespace {

// One row: example e's ending k after its context.
struct EvalRow {
  int example = -1, ending = 0;  // example -1: padding (all ranks run as many forwards)
};

// Row r's tokens and targets (T each): the context and the ending, then `pad`; the targets of
// the positions that predict an ending token are those tokens, the others -1.
void fill_row(const ChoiceExample& ex, int k, int pad, int T, int* tokens, int* targets) {
  const std::vector<int>& end = ex.endings[k];
  const int nc = (int)ex.context.size(), n = nc + (int)end.size();
  for (int t = 0; t < T; t++) {
    tokens[t] = t < nc ? ex.context[t] : t < n ? end[t - nc] : pad;
    targets[t] = t >= nc - 1 && t < n - 1 ? end[t - nc + 1] : -1;
  }
}

// The rows this dp rank scores, padded to the same count on every rank.
std::vector<EvalRow> rows_of(const std::vector<ChoiceExample>& examples, int dp, int dp_rank,
                             int B) {
  size_t most = 0;
  std::vector<EvalRow> rows;
  for (int r = 0; r < dp; r++) {
    size_t n = 0;
    for (size_t e = r; e < examples.size(); e += dp) n += examples[e].endings.size();
    most = std::max(most, n);
  }
  for (size_t e = dp_rank; e < examples.size(); e += dp)
    for (size_t k = 0; k < examples[e].endings.size(); k++) rows.push_back({(int)e, (int)k});
  most = (most + B - 1) / B * B;
  rows.resize(most);  // padding rows: example -1
  return rows;
}

}  // namespace

EvalResult eval_multiple_choice(GPT& m, ParamStore& store, const Pipeline& pl,
                                const std::vector<ChoiceExample>& examples, Comm& world, int dp,
                                int dp_rank, int pad, ops::Stream s) {
  const int B = m.B, cp = m.layout.cp->size, Tl = m.T, T = Tl * cp, cp_rank = m.layout.cp->rank;
  std::vector<size_t> first(examples.size() + 1, 0);  // each example's first ending's slot
  for (size_t e = 0; e < examples.size(); e++)
    first[e + 1] = first[e] + examples[e].endings.size();
  std::vector<double> sums(first.back(), 0.0);
  std::vector<int> tokens((size_t)B * T), targets((size_t)B * T);
  std::vector<int> local_in((size_t)B * Tl), local_tg((size_t)B * Tl);
  std::vector<float> losses((size_t)B * Tl);
  const bool counts = gpt_holds_output(m) && m.layout.tp.rank() == 0;
  const TokenPositions at_rank = cp_positions_of(cp, cp_rank, B, T);
  const std::vector<EvalRow> rows = rows_of(examples, dp, dp_rank, B);
  for (size_t at = 0; at < rows.size(); at += B) {
    for (int b = 0; b < B; b++) {
      const EvalRow& row = rows[at + b];
      int* tk = &tokens[(size_t)b * T];
      int* tg = &targets[(size_t)b * T];
      if (row.example >= 0) {
        fill_row(examples[row.example], row.ending, pad, T, tk, tg);
      } else {
        std::fill(tk, tk + T, pad);
        std::fill(tg, tg + T, -1);
      }
    }
    cp_select_tokens(local_in.data(), tokens.data(), cp, cp_rank, B, T);
    cp_select_tokens(local_tg.data(), targets.data(), cp, cp_rank, B, T);
    gpt_pipeline_forward(m, store, pl, {local_in.data(), local_tg.data(), 1, B, Tl}, s);
    if (!counts) continue;
    ops::stream_sync(s);
    ops::copy_to_host(losses.data(), m.losses, losses.size() * sizeof(float));
    // The local positions are chunk-major (cp_select_tokens): chunk k's (B, len) block after
    // chunk k-1's; one chunk of (B, T) with one cp rank.
    std::vector<double> row_sum(B, 0.0);
    for (size_t i = 0; i < local_tg.size(); i++)
      if (local_tg[i] >= 0) row_sum[(i % ((size_t)B * at_rank.len)) / at_rank.len] += losses[i];
    for (int b = 0; b < B; b++)
      if (rows[at + b].example >= 0)
        sums[first[rows[at + b].example] + rows[at + b].ending] = row_sum[b];
  }
  all_reduce_host_sum(world, sums.data(), (int)sums.size());
  EvalResult r;
  r.examples = (int)examples.size();
  for (size_t e = 0; e < examples.size(); e++) {
    int best = 0;
    for (size_t k = 0; k < examples[e].endings.size(); k++) {
      const double mean = sums[first[e] + k] / examples[e].endings[k].size();
      r.mean_loss.push_back(mean);
      if (mean < r.mean_loss[first[e] + best]) best = (int)k;
    }
    r.correct += best == examples[e].label;
  }
  return r;
}
