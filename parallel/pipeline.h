// parallel/pipeline.h - pipeline parallelism: the executor that runs a schedule's action list
// (parallel/pipeline_schedule.h) on this rank with the model's stages and the pp communicator.
// The idea, the bytes and the bubble are explained at the top of parallel/pipeline.cu.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "kernels/ops.h"
#include "parallel/comm.h"
#include "parallel/pipeline_schedule.h"

// What the executor asks of the model (model/gpt_pipeline.cu wires these to model/gpt.h).
struct PipelineStages {
  // Runs compute action a (Forward or Backward of micro-batch a.micro through chunk a.chunk) on
  // activation slot `slot`. `next` is this rank's next compute action, or null: the model
  // prefetches that action's first weights while this one computes.
  std::function<void(const PipeAction& a, int slot, const PipeAction* next)> compute;
  // Where a boundary message of a slot lives: SendForward the chunk's output, RecvForward its
  // input, RecvBackward / SendBackward its residual-stream gradient.
  std::function<void*(PipeOp op, int slot)> boundary;
  size_t boundary_count = 0;  // elements per message (B*T*C, or B*T/tp*C under SP)
  DType dt = DType::F32;
};

// One compute action of the last step, timed (milliseconds since the step began).
struct ActionTiming {
  PipeAction action;
  double start_ms = 0, end_ms = 0;
};

struct Pipeline {
  PipelineSchedule schedule;  // every rank's lists; this rank runs schedule.ranks[comm->rank]
  Comm* comm = nullptr;       // the pp group (the mesh's)
  int slots = 1;              // activation slots this rank needs: its peak live chunk forwards
  std::vector<ActionTiming> timing;  // this rank's compute actions in the last training step
  std::vector<ops::Event> events;    // two per compute action, and one for the step's start
  bool count_only = false;  // set before pipeline_init: no events, no timing (the planner)
};

// Builds the schedule of m micro-batches and v chunks per rank over the pp group (its rules were
// checked when the config was read: pipeline_rules) and sizes the slots from its simulation.
void pipeline_init(Pipeline& pl, const std::string& kind, int m, int v, Comm* group);
// The same with a schedule already built and checked, for the group's size (the planner builds
// it once for all ranks).
void pipeline_init_with(Pipeline& pl, const PipelineSchedule& schedule, Comm* group);
void pipeline_destroy(Pipeline& pl);
// The activation slots rank `rank` of a schedule needs (what pipeline_init sizes pl.slots to).
int pipeline_slots(const PipelineSchedule& sched, int rank);
// One training step: every action of this rank's list, in order; compute actions timed.
void pipeline_run(Pipeline& pl, const PipelineStages& stages, ops::Stream s);
// One micro-batch forward through every stage (validation, sampling): slot 0, no backward.
void pipeline_forward(const Pipeline& pl, const PipelineStages& stages, ops::Stream s);

// After a step: per rank, the busy time over the step's span and the bubble, gathered over the
// pp group (on every rank). With `timeline`, also an ASCII picture of the step, one line per
// rank, `width` columns.
struct PipelineReport {
  std::vector<double> busy_ms;  // per pp rank: time spent in compute actions
  double span_ms = 0;           // first action's start to the last one's end, over the ranks
  double bubble = 0;            // 1 - mean busy / span
  double bubble_formula = 0;    // (p-1)/(v*m + p-1)
  std::string timeline;
};
PipelineReport pipeline_report(const Pipeline& pl, bool timeline, int width = 96);
