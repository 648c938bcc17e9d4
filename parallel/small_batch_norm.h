// parallel/small_batch_norm.h - the state of [log] grad_noise_scale's measurement in the
// parameter store: |G_small|^2, the squared norm of one dp rank's first micro-batch gradient
// (what is measured, on which layouts, and the bytes: the top of parallel/small_batch_norm.cu;
// what the trainer makes of it: training/noise_scale.h).
#pragma once
#include <vector>

#include "parallel/comm.h"

struct ParamStore;

struct SmallBatchNorm {
  // Set before param_store_init (store_options does): the store then measures every step.
  bool on = false;
  // A zeroed device float of the working memory (so the planner counts it). Into it each rank
  // sums the squares of what it owns of one dp rank's first micro-batch gradient, before the dp
  // reduction: a block's at its first release, the units used by the whole step (the root) when
  // the first micro-batch's backward ends, the tied root's after grads_wait has summed its two
  // pipeline halves. The trainer sums the ranks' values over the store's world.
  float* squares = nullptr;
  bool measured = false;  // the whole-step units are measured this step
  // Per unit: grads_release calls this step (the first ends the unit's first micro-batch).
  std::vector<int> releases;
  // Per unit, pp > 1: the tied root's first-micro-batch gradient, kept until grads_wait sums it
  // over the embedding group; null for every other unit.
  std::vector<float*> tied_copy;
  Comm* cp = nullptr;  // the context-parallel group (its partial sums are summed first)
};

// Buffers (param_store_init); nothing without `on`.
void small_batch_init(ParamStore& store, const CommsByAxis& comms);
// grads_zero: a new step.
void small_batch_reset(ParamStore& store);
// grads_release, before the unit's reduction: a block's first release measures its bucket.
void small_batch_on_release(ParamStore& store, int unit);
// grads_micro_batch_done: the whole-step units (the root) hold the first micro-batch's only.
void small_batch_micro_batch_done(ParamStore& store);
// grads_wait: the tied root's halves summed over the embedding group (comm stream), then squared
// (compute stream, after the comm stream is joined).
void small_batch_tied_sum(ParamStore& store);
void small_batch_tied_squares(ParamStore& store);
