// training/optimizer.cu - learning-rate schedule and AdamW over shards.
//
// The clipping factor is the store's, on the device (parallel/param_store.cu grad_norm: PyTorch's
// clip_grad_norm_ factor, ops::grad_norm_and_clip): AdamW multiplies the gradients by it where it
// lies, so the host never waits for the gradient norm.
// The store's flat layout puts each unit's weight-decayed matrices first ([0, decay_numel)),
// so the update of one shard [lo, hi) is at most two fused AdamW launches: the part of the
// shard inside the decayed range, with weight decay, and the rest, without. The padding past
// the unit's end is zero with zero gradient and stays zero, so it is updated along with the
// rest rather than skipped. Where the shard lives (device memory, or host memory and a file under
// optimizer offload) and what follows the update (ZeRO-1/2's all-gather) are the store's.
#include "training/optimizer.h"

#include <algorithm>
#include <cmath>

float learning_rate(const TrainConfig& t, int step) {
  const int s = step - 1;  // 0-based
  if (s < t.warmup_steps) return t.lr * (float)(s + 1) / (float)t.warmup_steps;
  if (t.lr_schedule == "constant") return t.lr;
  const int decay_steps = std::max(1, t.steps - t.warmup_steps);
  const double ratio = std::min(1.0, (double)(s - t.warmup_steps) / decay_steps);
  const double coeff = 0.5 * (1.0 + std::cos(M_PI * ratio));
  return (float)(t.min_lr + coeff * (t.lr - t.min_lr));
}

void optimizer_step(ParamStore& st, const GPTLayout& layout, const TrainConfig& t, int step,
                    float lr) {
  AdamWStep adam{lr, t.beta1, t.beta2, t.eps, t.weight_decay, 1.0f, step};
  adam.device_grad_scale = st.clip_factor;  // grad_norm's clipping factor, on the device
  AdamWStep no_decay = adam;
  no_decay.weight_decay = 0.0f;
  for (size_t u = 0; u < st.units.size(); u++) {
    const UnitState& us = st.units[u];
    const size_t lo = us.shard_offset, hi = us.shard_offset + us.shard_numel;
    const size_t split = std::clamp(layout.units[u].decay_numel, lo, hi);
    const ShardForUpdate shard = update_begin(st, (int)u);  // on the device or the host
    shard_adamw(st, shard, lo, split, adam);
    shard_adamw(st, shard, split, hi, no_decay);
    update_end(st, (int)u);
  }
  updates_done(st);  // ZeRO-1/2: the new weights gathered; offload: its files written
}
