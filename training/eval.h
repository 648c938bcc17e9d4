// training/eval.h - multiple-choice evaluation (HellaSwag-style, [eval]): each example is a
// context and a few endings (data/eval_file.h); the model's choice is the ending whose tokens
// have the lowest mean loss after the context, and the accuracy is the fraction of examples
// where that is the labelled ending (llm.c's HellaSwag scoring). Ties go to the first ending.
//
// Over the data-parallel ranks: dp rank r scores examples r, r + dp, ...; each row (context +
// one ending, padded with end-of-text, targets -1 outside the ending) runs forward in
// micro-batches of B rows through the pipeline (every stage, tp and cp rank takes part, and
// every dp rank runs the same number of forwards: FSDP gathers weights from all of them). The
// last stage sums each row's ending losses (in double, on the host) and one all-reduce over the
// world adds the rows' sums from every rank (tp rank 0 of the last stage counts; cp ranks add
// their positions). Collective: every rank calls it.
#pragma once
#include <vector>

#include "data/eval_file.h"
#include "model/gpt_pipeline.h"
#include "parallel/comm.h"

struct EvalResult {
  int correct = 0, examples = 0;
  std::vector<double> mean_loss;  // per example, per ending (examples x endings, row-major)
  double accuracy() const { return examples ? (double)correct / examples : 0.0; }
};

// pad: the token that fills a row after its ending (its targets are ignored).
EvalResult eval_multiple_choice(GPT& model, ParamStore& store, const Pipeline& pl,
                                const std::vector<ChoiceExample>& examples, Comm& world,
                                int dp, int dp_rank, int pad, ops::Stream s);
