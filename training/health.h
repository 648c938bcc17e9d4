// training/health.h - watching a run's health as it trains: loss spikes, whose updates are
// skipped ([train] skip_spikes), and stragglers, ranks persistently slower than the others
// ([log] straggler_every, straggler_factor).
//
// Loss spikes. A bad batch (corrupt text, a run of one repeated token) or an unlucky update can
// throw the loss far above its trend; applying that update can spoil the weights and the Adam
// moments for many steps. With skip_spikes = K > 0, a step whose loss exceeds the running mean
// of the loss by more than K running standard deviations is a spike: its update is not applied
// (weights, moments and Adam's step count untouched; the gradients are discarded), the step and
// its batch are named in the log, and training goes on. The running mean and variance are
// exponential moving averages over the applied steps (decay kLossTrendDecay, a memory of about
// 50 steps); no step is judged before kLossTrendWarmup steps have been applied, except that a
// loss that is not finite is always a spike. After
// [train] max_skips spikes in a row the run stops (exit status 1): the trend itself has moved,
// and skipping more would only hide it. Every rank reaches the same verdict (the loss is the
// global batch's, the same on every rank), so no communication is needed. The trend is saved in
// checkpoints (checkpoint/hdf5_format.h: /train), so a resumed run skips exactly as the
// uninterrupted one would.
//
// Stragglers. A rank's busy time of a step is the step's wall time minus the time it waited
// in MPI for other ranks (parallel/watchdog.h: waited_s). Every straggler_every steps the ranks
// gather the median of their busy times over those steps (one all-gather of a double,
// uncounted: control, not the model's data) and rank 0 prints the slowest and the fastest rank,
// by name (rank and host), and the median over ranks; a rank whose median exceeds
// straggler_factor times the median over ranks - slow in most of the window's steps, not once -
// is named as a straggler. Under NCCL the host does not wait inside collectives, so there the
// busy time includes the waits for other GPUs; only the host helpers' waits are subtracted. And
// a rank slowed from outside while it is inside MPI (starved of CPU, stopped) is slow in its
// waits as well as in its work, and that part counts as waiting: the report names the ranks
// whose own work is slow (a slow device, an uneven layout).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "config/config.h"
#include "parallel/mesh.h"

constexpr double kLossTrendDecay = 0.98;
constexpr int kLossTrendWarmup = 20;

struct LossTrend {
  double mean = 0, var = 0;   // of the loss over the applied updates (moving averages)
  int64_t applied = 0;        // updates applied
  int64_t skipped = 0;        // updates skipped as spikes: Adam's step count is step - skipped
  int skipped_in_a_row = 0;
};

struct SpikeVerdict {
  bool skip = false;
  double sigmas = 0;  // how far above the mean the loss is, in standard deviations
};
// Judges step's loss (skip_spikes = 0: never a spike) and updates the trend: with the loss when
// it is applied, the skip counts when it is a spike. Stops the run after max_skips spikes in a
// row. `batch` describes the step's data for the log line.
SpikeVerdict loss_spike_check(LossTrend& t, const TrainConfig& c, int step, double loss,
                              const std::string& batch, bool print);

struct StragglerWatch {
  std::vector<double> busy_ms;     // this rank's busy time of each step of the window
  std::vector<std::string> names;  // every rank's "rank r (host)", gathered at the first report
};
// After every step, all ranks: records the step's busy time; every straggler_every steps reports.
void straggler_step(StragglerWatch& w, const LogConfig& c, Comm& world, int step, double step_ms,
                    double waited_ms);
