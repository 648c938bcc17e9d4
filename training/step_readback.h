// training/step_readback.h - a step that never waits on the host: the step's loss and gradient
// norm stay on the device, and the host reads them back only when something needs them.
//
// The idea. On a GPU the host queues a step's kernels and runs ahead; every read of a device
// value (cudaMemcpy, a stream or event synchronisation) makes it wait until the queue drains, and
// the GPU idles while the host queues the next step. A step's only outputs the host needs are two
// scalars: the loss (the mean over the global batch) and the gradient norm. Both are reduced over
// the world on the device (each rank's part all-gathered, added in double in rank order: the same
// bits as the host's MPI sum, ops::sum_parts), copied into pinned host memory behind the step
// (asynchronously), and read - one event wait for every step since the last read - only when due:
//   a step line is printed ([log] every, the first and the last step);
//   a checkpoint is written (it keeps the loss trend, which every step's loss updates);
//   validation, evaluation or a sample runs (their records follow the step's in the metrics);
//   the run stops on a signal; or kCapacity steps are waiting.
// Until then each step's report waits here; when read, the reports are completed in step order:
// the loss trend updated (training/health.h), the divergence check (a loss or norm that is not
// finite stops the run, naming its step, as before - only up to kCapacity steps later), and the
// metrics records and lines written. The records are the same as when every step was read at
// once; only the moment they are written moves.
//
// What still reads every step, by its option: [train] skip_spikes (the update is skipped on the
// loss, so the loss is read before the update - a host wait every step), [log] grad_noise_scale
// (its estimate reads the norm and the small-batch norm), and a MoE model's router choices
// (model/moe.cu: they size the dispatch and the all-to-all).
#pragma once
#include <vector>

#include "kernels/allocator.h"
#include "model/gpt.h"
#include "parallel/comm.h"
#include "training/health.h"
#include "training/metrics.h"

struct PendingStep {
  StepReport rep;          // loss and grad_norm filled in when read
  CommStats comm{};        // the step's counters (the record prints them)
  bool print = false;      // its step line is printed
  bool judged = false;     // its loss already went through loss_spike_check (skip_spikes)
  bool skipped = false;    // its update was skipped as a loss spike
};

struct StepReadback {
  static constexpr int kCapacity = 256;  // steps that may wait to be read
  float* loss_parts = nullptr;  // device: [0] this rank's loss part, then every rank's
  double* loss = nullptr;       // device: the step's loss
  double* host = nullptr;       // pinned: (loss, grad norm) per waiting step
  ops::Event copied = nullptr;  // after the last step's copy into `host`
  std::vector<PendingStep> pending;
  int world = 1;
};

// The device buffers from `device` (the model's allocator: the planner counts them the same way),
// the pinned host slots (none when the allocator only counts).
void step_readback_init(StepReadback& rb, Allocator& device, int world_size, ops::Stream s);
void step_readback_destroy(StepReadback& rb);
// Queues the step's loss (the mean over the global batch of the last stage's losses, as
// last_stage_mean: training/evaluate.h) into rb.loss and the copies of it and of the store's
// norm into the host slot of the newest pending step. No host wait.
void step_readback_queue(StepReadback& rb, const GPT& model, Comm& world, int dp,
                         const double* device_norm, ops::Stream s);
// [train] skip_spikes: waits for the newest step's copies and puts its loss and norm in its
// report, before its update (a host wait every step).
void step_readback_read_newest(StepReadback& rb);
// Waits for the copies and completes every pending step in order: its loss and grad_norm, its
// loss judged (the trend updated) unless it was already, and the divergence check (which
// records the steps before the diverged one, then stops the run).
void step_readback_settle(StepReadback& rb, LossTrend& trend, const TrainConfig& c,
                          MetricsLog& log, bool rank0);
// Writes the settled steps' metrics records and lines (rank 0) and forgets them.
void step_readback_write(StepReadback& rb, MetricsLog& log, bool rank0);
