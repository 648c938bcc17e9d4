// training/noise_scale.cu - the gradient noise scale's estimators and their averages (the
// formulas, where the two batch sizes come from and the layouts it covers: every ZeRO stage, tp,
// pp with 1f1b, cp, experts with ep = 1, DiLoCo islands, training/noise_scale.h; how the small
// batch is measured on them and its bytes, parallel/small_batch_norm.cu).
#include "training/noise_scale.h"

#include "kernels/common.h"
#include "parallel/param_store.h"

void noise_scale_update(NoiseScale& ns, double small_sq, double big_sq, double b_small,
                        double b_big) {
  CHECK(b_big > b_small && b_small > 0, "noise scale: batch sizes %g and %g", b_small, b_big);
  ns.small_sq = small_sq, ns.big_sq = big_sq, ns.b_small = b_small, ns.b_big = b_big;
  ns.grad_sq = (b_big * big_sq - b_small * small_sq) / (b_big - b_small);
  ns.trace = (small_sq - big_sq) / (1.0 / b_small - 1.0 / b_big);
  ns.ema_grad_sq = ns.beta * ns.ema_grad_sq + (1 - ns.beta) * ns.grad_sq;
  ns.ema_trace = ns.beta * ns.ema_trace + (1 - ns.beta) * ns.trace;
  ns.steps++;
}

double noise_scale_simple(const NoiseScale& ns) {
  return ns.steps > 0 && ns.ema_grad_sq != 0 ? ns.ema_trace / ns.ema_grad_sq : 0.0;
}

// The small batch is each dp rank's first micro-batch (the squares of what each rank owns of it,
// summed before the dp reduction: parallel/small_batch_norm.cu), the big batch the step (with
// DiLoCo the island's). One all-reduce of a double over the (island's) world adds the ranks'
// parts: the sum over the dp ranks of their |G_small|^2. Both gradients carry the loss's
// 1/(batch) scale, so the small one is scaled up by (batch / micro-batch) = grad_accum x dp to
// be its own batch's mean.
bool noise_scale_step(NoiseScale& ns, ParamStore& store, double grad_norm, int micro_batch,
                      int grad_accum, int dp) {
  if (!store.small_batch.on) return false;
  float local = 0;
  ops::stream_sync(store.compute);
  ops::copy_to_host(&local, store.small_batch.squares, sizeof(float));
  const double up = (double)grad_accum * dp;
  const double small_sq = all_reduce_host_sum(*store.world, (double)local) / dp * up * up;
  noise_scale_update(ns, small_sq, grad_norm * grad_norm, micro_batch,
                     (double)micro_batch * grad_accum * dp);
  return true;
}
