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
// The trainer takes the small batch to be each rank's first micro-batch (its gradient before any
// reduction: B_small = micro_batch sequences, |G_small|^2 averaged over the dp ranks with one
// scalar all-reduce) and the big batch to be the whole step (B_big = micro_batch x grad_accum x
// dp, |G_big|^2 the squared gradient norm the step computes anyway). So it works on one rank
// from micro-batches (grad_accum >= 2) and on dp ranks with any grad_accum, at every ZeRO stage:
// DDP and ZeRO-1 sum the squares of the full local gradient, ZeRO-2 and FSDP those of each
// unit's bucket (the whole local gradient of that unit) before its reduce-scatter, at the unit's
// first release of the step (parallel/param_store.cu grads_release). Under tp, pp, cp and
// experts a rank holds only part of its dp rank's gradient, and some parts (sequence-parallel
// LayerNorms, the tied embedding's two copies, cp's token halves) are partial sums whose squares
// do not add, so those layouts are refused (config/config_checks.cu check_noise_scale). One step's estimates
// are noisy (either can be negative), so both are smoothed by an exponential moving average
// before the ratio is taken (the bias correction of an EMA started at zero is the same factor in
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
