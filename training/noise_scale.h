// training/noise_scale.h - the gradient noise scale ([log] grad_noise_scale): how large a batch
// the run can use at all (McCandlish et al., "An Empirical Model of Large-Batch Training", 2018).
//
// The simple noise scale B_simple = tr(Sigma) / |G|^2, where G is the true gradient and Sigma the
// covariance of one example's gradient: below B_simple a larger batch buys almost proportionally
// fewer steps, above it little. Neither is known, but the squared norm of a batch mean of B
// examples has expectation E|G_B|^2 = |G|^2 + tr(Sigma) / B, so two batch sizes give unbiased
// estimates of both (the paper's appendix A):
//
//   |G|^2    ~ (B_big |G_big|^2 - B_small |G_small|^2) / (B_big - B_small)
//   tr(Sigma) ~ (|G_small|^2 - |G_big|^2) / (1/B_small - 1/B_big)
//
// The trainer takes the small batch to be each dp rank's first micro-batch (its gradient over
// the whole model before the dp reduction: B_small = micro_batch sequences, |G_small|^2 averaged
// over the dp ranks with one scalar all-reduce over the world) and the big batch to be the whole
// step (B_big = micro_batch x grad_accum x dp, |G_big|^2 the squared gradient norm the step
// computes anyway; with DiLoCo islands dp and the world are the island's). So it works on one
// rank from micro-batches (grad_accum >= 2) and on dp ranks with any grad_accum, at every ZeRO
// stage, and with tp, pp (1f1b), cp and experts without ep: parallel/small_batch_norm.cu measures
// a dp rank's small batch spread over its model-parallel group (owned blocks add, replicated
// tails count once, partial sums - cp's token halves, sequence-parallel norms, the tied
// embedding's two stages - are summed as vectors first) and states the bytes that costs: with
// dp and plain tp only the 8-byte scalar, with cp an all-reduce of the first micro-batch's
// gradient over cp, with sp a few norm weight vectors over tp, with pp the root over two stages.
// Refused (config/config_checks.cu check_noise_scale): ep > 1 (an expert's gradient on a rank
// mixes the tokens of several dp ranks before any reduction, so no part of it is one dp rank's),
// pipeline schedules other than 1f1b, and a single batch size.
// One step's estimates are noisy (either can be negative), so both are smoothed by an exponential
// moving average before the ratio is taken (the bias correction of an EMA started at zero is the same factor in
// both and cancels in the ratio).
#pragma once

struct NoiseScale {
  double beta = 0.95;               // EMA factor per step
  double ema_grad_sq = 0, ema_trace = 0;
  double grad_sq = 0, trace = 0;    // this step's unbiased estimates of |G|^2 and tr(Sigma)
  double small_sq = 0, big_sq = 0;  // this step's measured |G_small|^2 and |G_big|^2
  double b_small = 0, b_big = 0;
  int steps = 0;
};

// One step: |G_small|^2 (mean over the small batches of b_small examples each) and |G_big|^2 (b_big
// examples, b_big > b_small).
void noise_scale_update(NoiseScale& ns, double small_sq, double big_sq, double b_small,
                        double b_big);
// B_simple from the averages so far, in examples (sequences); 0 before the first update.
double noise_scale_simple(const NoiseScale& ns);

struct ParamStore;
// After a step's gradient norm, when the store measured the small batch
// (parallel/small_batch_norm.h): the ranks' parts of |G_small|^2 summed over the store's world,
// both batches' sizes (micro_batch; micro_batch x grad_accum x dp, dp the gradient group's:
// with DiLoCo the island's), and one update. Returns whether the store measured one (collective
// over the store's world then).
bool noise_scale_step(NoiseScale& ns, ParamStore& store, double grad_norm, int micro_batch,
                      int grad_accum, int dp);
