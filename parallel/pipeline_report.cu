// parallel/pipeline_report.cu - what a pipelined step measured (parallel/pipeline.h:
// pipeline_report): the executor (parallel/pipeline.cu) times every compute action of the last
// step with events (the host clock on the CPU backend); this file gathers those timings over the
// pp group, compares the idle fraction with the bubble the schedule would give at those durations
// and with the schedule's formula, and draws the step.
//
// Who talks to whom, bytes. One all-gather of host doubles over the pp group: per rank and
// compute action five numbers (op, micro-batch, chunk, start, end). Not counted: no payload of
// the model.
//
// Three bubbles. Measured: 1 - (mean busy time) / span, where the span runs from the first start
// to the last end over the ranks. Predicted: the simulator (parallel/pipeline_simulator.cu) runs
// the lists with each action at its measured duration and communication free; ranks that share
// cores, or slow messages, make the measured bubble larger than this one. Formula: the schedule's
// at equal costs (pipeline_schedule_bubble).
//
// The drawing. One line per rank, `width` columns over the span: each action from its start to
// its end, its op letter (F, B, W; lower case for chunks after the first) and micro-batch first,
// '=' after, '.' idle. An action shorter than a column still gets one, pushed right of the one
// before it; the numbers themselves follow, one line per rank, for whoever checks the picture.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "parallel/pipeline.h"

namespace {

// One compute action as the report gathers it: op, micro, chunk, start, end (ms).
constexpr int kFields = 5;

// One rank's compute actions (in time order) as characters: each at least one column and never
// on top of the previous one, so every action keeps its letter while there are fewer actions
// than columns (an action shorter than a column is pushed right by at most the ones before it,
// and left by at most the ones after it, which each keep a column at the end).
std::string draw_rank(const double* t, int n, double span, int width) {
  std::string line(width, '.');
  int next_free = 0;
  for (int k = 0; k < n; k++) {
    const double* a = &t[kFields * k];  // op, micro, chunk, start, end
    const int last = width - (n - k);  // the columns after it are left to the rest
    const int c0 = std::min(last, std::max(next_free, (int)(a[3] / span * width)));
    const int c1 = std::max(c0 + 1, std::min(last + 1, (int)std::lround(a[4] / span * width)));
    next_free = c1;
    for (int c = c0; c < c1; c++) line[c] = '=';
    line[c0] = (a[2] > 0 ? "fbw" : "FBW")[(int)a[0]];  // PipeOp Forward, Backward, Weight
    if (c1 - c0 >= 2) line[c0 + 1] = "0123456789abcdef"[(int)a[1] % 16];
  }
  return line;
}

// The same actions as numbers: each as its op letter (F, B, W), micro-batch, '.', chunk, '@',
// start and end in ms from the rank's own start.
std::string list_rank(const double* t, int n) {
  std::string out;
  char buf[96];
  for (int k = 0; k < n; k++) {
    const double* a = &t[kFields * k];
    std::snprintf(buf, sizeof(buf), " %c%d.%d@%.6f-%.6f", "FBW"[(int)a[0]], (int)a[1], (int)a[2],
                  a[3], a[4]);
    out += buf;
  }
  return out;
}

// Every rank's timings of the last step, rank after rank (n actions each: every rank of a
// schedule computes as many).
std::vector<double> gather_timings(const Pipeline& pl) {
  const int n = (int)pl.timing.size();
  std::vector<double> mine(kFields * n), all(kFields * (size_t)n * pl.schedule.p);
  for (int k = 0; k < n; k++) {
    const ActionTiming& t = pl.timing[k];
    const double row[kFields] = {(double)t.action.op, (double)t.action.micro,
                                 (double)t.action.chunk, t.start_ms, t.end_ms};
    std::copy(row, row + kFields, &mine[kFields * k]);
  }
  all_gather_host(*pl.comm, mine.data(), mine.size() * sizeof(double), all.data());
  return all;
}

}  // namespace

PipelineReport pipeline_report(Pipeline& pl, bool timeline, int width) {
  pipeline_read_timing(pl);  // the last step's events (parallel/pipeline.cu)
  const PipelineSchedule& sch = pl.schedule;
  const int p = sch.p, n = (int)pl.timing.size();
  const std::vector<double> all = gather_timings(pl);
  auto rank_row = [&](int r) { return all.data() + kFields * (size_t)r * n; };
  PipelineReport rep;
  rep.busy_ms.assign(p, 0.0);
  PipeCosts measured;  // every rank's actions at their measured durations, run by the simulator
  for (int r = 0; r < p; r++) {
    measured.measured.emplace_back();
    for (int k = 0; k < n; k++) {
      const double* a = rank_row(r) + kFields * k;
      rep.busy_ms[r] += a[4] - a[3];
      rep.span_ms = std::max(rep.span_ms, a[4]);
      measured.measured[r].push_back(a[4] - a[3]);
    }
  }
  double mean_busy = 0;
  for (double b : rep.busy_ms) mean_busy += b / p;
  rep.bubble = rep.span_ms > 0 ? 1.0 - mean_busy / rep.span_ms : 0.0;
  rep.bubble_predicted = pipeline_simulate(sch, measured, PipeComm::Rendezvous).bubble();
  rep.bubble_formula = pipeline_schedule_bubble(sch.kind, p, sch.m, sch.v);
  if (timeline && rep.span_ms > 0)
    for (int r = 0; r < p; r++) {
      const std::string who = "pp rank " + std::to_string(r);
      rep.timeline += who + " |" + draw_rank(rank_row(r), n, rep.span_ms, width) + "|\n";
      rep.actions += who + " actions:" + list_rank(rank_row(r), n) + "\n";
    }
  return rep;
}
