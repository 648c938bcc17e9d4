// training/health.cu - loss spikes and stragglers (training/health.h).
#include "training/health.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

// ---------------------------------------------------------------------------------------------
// Loss spikes
// ---------------------------------------------------------------------------------------------
SpikeVerdict loss_spike_check(LossTrend& t, const TrainConfig& c, int step, double loss,
                              const std::string& batch, bool print) {
  SpikeVerdict v;
  const double sd = std::sqrt(t.var);
  if (c.skip_spikes > 0 && !std::isfinite(loss)) {  // a NaN or an infinite loss: always a spike
    v.sigmas = INFINITY;
    v.skip = true;
  } else if (c.skip_spikes > 0 && t.applied >= kLossTrendWarmup && sd > 0) {
    v.sigmas = (loss - t.mean) / sd;
    v.skip = v.sigmas > c.skip_spikes;
  }
  if (v.skip) {
    t.skipped++;
    t.skipped_in_a_row++;
    if (print)
      std::printf("spike    step %d: loss %.6f is %.1f standard deviations above the running "
                  "mean %.6f ([train] skip_spikes = %g): update skipped (%d in a row); batch: %s\n",
                  step, loss, v.sigmas, t.mean, c.skip_spikes, t.skipped_in_a_row, batch.c_str());
    std::fflush(stdout);
    CHECK_ALL(t.skipped_in_a_row < c.max_skips,
              "step %d: %d loss spikes in a row ([train] max_skips = %d): the loss has left its "
              "trend (mean %.6f, standard deviation %.6f) for good; stopping", step,
              t.skipped_in_a_row, c.max_skips, t.mean, sd);
    return v;
  }
  t.skipped_in_a_row = 0;
  if (t.applied == 0) {
    t.mean = loss;
  } else {  // exponential moving mean and variance (West's incremental form)
    const double diff = loss - t.mean;
    const double incr = (1 - kLossTrendDecay) * diff;
    t.mean += incr;
    t.var = kLossTrendDecay * (t.var + diff * incr);
  }
  t.applied++;
  return v;
}

// ---------------------------------------------------------------------------------------------
// Stragglers
// ---------------------------------------------------------------------------------------------
static double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0 : n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static std::string rank_name(int rank) {
  char host[256] = "?";
  gethostname(host, sizeof(host) - 1);
  return "rank " + std::to_string(rank) + " (" + host + ")";
}

static void report(const StragglerWatch& w, const LogConfig& c, const std::vector<double>& busy,
                   int first, int last) {
  const double mid = median(busy);
  const auto slow = std::max_element(busy.begin(), busy.end()) - busy.begin();
  const auto fast = std::min_element(busy.begin(), busy.end()) - busy.begin();
  std::printf("ranks    steps %d-%d, busy ms per step (median; the step minus its waits for other "
              "ranks): slowest %s %.2f, fastest %s %.2f, median of ranks %.2f\n", first, last,
              w.names[slow].c_str(), busy[slow], w.names[fast].c_str(), busy[fast], mid);
  for (size_t r = 0; r < busy.size(); r++)
    if (mid > 0 && busy[r] > c.straggler_factor * mid)
      std::printf("straggler %s: %.2f ms per step over steps %d-%d, %.2f x the median of ranks "
                  "%.2f ms ([log] straggler_factor = %g)\n", w.names[r].c_str(), busy[r], first,
                  last, busy[r] / mid, mid, c.straggler_factor);
  std::fflush(stdout);
}

void straggler_step(StragglerWatch& w, const LogConfig& c, Comm& world, int step, double step_ms,
                    double waited_ms) {
  if (c.straggler_every <= 0 || world.size < 2) return;
  w.busy_ms.push_back(std::max(0.0, step_ms - waited_ms));
  if ((int)w.busy_ms.size() < c.straggler_every) return;
  if (w.names.empty()) w.names = all_gather_strings(world, rank_name(world.rank));
  const double mine = median(w.busy_ms);
  std::vector<double> busy(world.size);
  all_gather_host(world, &mine, sizeof(mine), busy.data());
  if (world.rank == 0) report(w, c, busy, step - (int)w.busy_ms.size() + 1, step);
  w.busy_ms.clear();
}
