// training/step_readback.cu - the step's loss and gradient norm read back only when due
// (training/step_readback.h).
//
// Per step, on the compute stream, after the store's norm (parallel/param_store.cu grad_norm):
//   loss_parts[0] = this rank's loss sum (the last stage's tp rank 0; 0 elsewhere)
//   all_gather_control over the world -> loss_parts[1 ..]       (4 bytes per rank, uncounted)
//   loss = sum of the parts in rank order, in double, / dp      (ops::sum_parts)
//   host[2k] = loss, host[2k + 1] = norm                        (async copies into pinned memory)
// and the host moves on. step_readback_settle waits for the last copy (one event) and reads them
// all.
#include "training/step_readback.h"

#include <cmath>

#include "model/gpt_pipeline.h"

void step_readback_init(StepReadback& rb, Allocator& device, int world_size, ops::Stream s) {
  rb.world = world_size;
  rb.loss_parts = (float*)allocate_zeroed(device, (1 + world_size) * sizeof(float), s);
  rb.loss = (double*)allocate_zeroed(device, sizeof(double), s);
  rb.copied = allocate_event(device);
  if (!device.count_only)
    rb.host = (double*)ops::alloc_host_pinned(2 * StepReadback::kCapacity * sizeof(double));
}

void step_readback_destroy(StepReadback& rb) {
  ops::release_host_pinned(rb.host);  // the device buffers go with their allocator
  rb.host = nullptr;
}

void step_readback_queue(StepReadback& rb, const GPT& m, Comm& world, int dp,
                         const double* device_norm, ops::Stream s) {
  CHECK(!rb.pending.empty() && (int)rb.pending.size() <= StepReadback::kCapacity,
        "step readback: %zu steps waiting (1 to %d)", rb.pending.size(), StepReadback::kCapacity);
  const bool counts = gpt_holds_output(m) && m.layout.tp.rank() == 0;  // tp ranks hold copies
  if (counts) ops::copy_on_device(rb.loss_parts, m.loss_sum, sizeof(float), s);
  else ops::fill_zero(rb.loss_parts, sizeof(float), s);
  all_gather_control(world, rb.loss_parts, rb.loss_parts + 1, 1, s);
  ops::sum_parts(rb.loss, rb.loss_parts + 1, world.size, (double)dp, s);
  double* slot = rb.host + 2 * (rb.pending.size() - 1);
  ops::copy_to_host_async(slot, rb.loss, sizeof(double), s);
  ops::copy_to_host_async(slot + 1, device_norm, sizeof(double), s);
  ops::event_record(rb.copied, s);
}

void step_readback_read_newest(StepReadback& rb) {
  ops::event_sync(rb.copied);
  const size_t k = rb.pending.size() - 1;
  rb.pending[k].rep.loss = rb.host[2 * k];
  rb.pending[k].rep.grad_norm = rb.host[2 * k + 1];
}

void step_readback_settle(StepReadback& rb, LossTrend& trend, const TrainConfig& c,
                          MetricsLog& log, bool rank0) {
  if (rb.pending.empty()) return;
  ops::event_sync(rb.copied);  // the one host wait: every waiting step's values are down
  for (size_t k = 0; k < rb.pending.size(); k++) {
    PendingStep& p = rb.pending[k];
    if (!p.judged) {  // (skip_spikes reads and judges a step's loss at the step)
      p.rep.loss = rb.host[2 * k];
      p.rep.grad_norm = rb.host[2 * k + 1];
      // skip_spikes = 0 here: never a spike; the trend (kept in checkpoints) follows every loss
      loss_spike_check(trend, c, p.rep.step, p.rep.loss, "", false);
      p.judged = true;
    }
    if (p.skipped || (std::isfinite(p.rep.loss) && std::isfinite(p.rep.grad_norm))) continue;
    for (size_t j = 0; j < k; j++)  // the steps before it are recorded, as they were before
      if (rank0) metrics_step(log, rb.pending[j].rep, rb.pending[j].comm, false);
    FATAL("step %d: loss %g, gradient norm %g: training diverged", p.rep.step, p.rep.loss,
          p.rep.grad_norm);
  }
}

void step_readback_write(StepReadback& rb, MetricsLog& log, bool rank0) {
  for (const PendingStep& p : rb.pending)
    if (rank0) metrics_step(log, p.rep, p.comm, p.print);
  rb.pending.clear();
}
