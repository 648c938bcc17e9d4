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

// One compute action as the executor hands it to the model.
struct ComputeCall {
  PipeAction action;               // Forward, Backward or Weight of (micro, chunk)
  int slot = 0;                    // the activation slot of (micro, chunk)
  const PipeAction* next = nullptr;  // this rank's next Forward or Backward, or null: the model
                                     // prefetches its first weights (a Weight needs none)
  bool split = false;              // the schedule splits backwards: a Backward is the input-
                                   // gradient part only, a Weight the weight-gradient part
  bool last_of_chunk = false;      // no later action of this op on this chunk in the step: the
                                   // chunk's gradients are complete after it (the last Backward,
                                   // or the last Weight when split)
  int grad = -1;                   // the gradient buffer of (micro, chunk) (a pool apart from
                                   // the slots, parallel/pipeline.cu); -1: the action uses none
  int local_grad = -1;             // a Backward's: the previous stage's, when on this rank too
  int local_slot = -1;             // the slot of the previous stage when it is on this rank too
                                   // (V order: rank p-1): a Forward's input is that slot's chunk
                                   // output; a Backward's input gradient goes to that slot's
                                   // gradient (the previous stage's backward starts from it)
};

// What the executor asks of the model (model/gpt_pipeline.cu wires these to model/gpt.h).
struct PipelineStages {
  std::function<void(const ComputeCall& call)> compute;
  // Where boundary message a (of a.chunk) lives: SendForward the chunk's output and RecvForward
  // its input in slot `at`, RecvBackward / SendBackward its residual-stream gradient in gradient
  // buffer `at`.
  std::function<void*(const PipeAction& a, int at)> boundary;
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
  int grads = 1;              // residual-gradient buffers it needs (pipeline_grad_buffers)
  // This rank's compute actions in the last training step, and the events that time them: two
  // per compute action, and one for the step's start. The events are read (a host wait) only
  // when a report asks for the timing (pipeline_report), never during a step.
  std::vector<PipeAction> computed;
  std::vector<ops::Event> events;
  std::vector<ActionTiming> timing;  // filled from the events by pipeline_report
  bool count_only = false;  // set before pipeline_init: no events, no timing (the planner)
  // No timing events either: the step is captured as a CUDA graph, whose events mark nothing
  // the host can read (training/cuda_graph.h). pipeline_report then has no timings.
  bool untimed = false;
};

// Builds the schedule of m micro-batches and v chunks per rank over the pp group (its rules were
// checked when the config was read: pipeline_rules, pipeline_config_problems), sizes the slots
// and opens the group's 2v message channels (tags: parallel/comm.h). Collective over the group.
void pipeline_init(Pipeline& pl, const std::string& kind, int m, int v, Comm* group);
// The same with a schedule already built and checked, for the group's size (the planner builds
// it once for all ranks).
void pipeline_init_with(Pipeline& pl, const PipelineSchedule& schedule, Comm* group);
void pipeline_destroy(Pipeline& pl);
// The activation slots rank `rank` of a schedule needs (what pipeline_init sizes pl.slots to): a
// (micro-batch, chunk) holds one from the first action of its in the list (the receive of its
// input, or its forward) to the last (the send of its input gradient, its backward, or its
// weight pass when split).
int pipeline_slots(const PipelineSchedule& sched, int rank);
// The residual-stream gradient buffers it needs: the most (micro-batch, chunk) gradients live at
// once, each from its first use to its last (the top of parallel/pipeline.cu).
int pipeline_grad_buffers(const PipelineSchedule& sched, int rank);
// One training step: every action of this rank's list, in order; compute actions timed.
void pipeline_run(Pipeline& pl, const PipelineStages& stages, ops::Stream s);
// pl.timing from the last step's events: waits on the host (pipeline_report calls it).
void pipeline_read_timing(Pipeline& pl);
// One micro-batch forward through every stage (validation, sampling): slot 0, no backward.
void pipeline_forward(const Pipeline& pl, const PipelineStages& stages, ops::Stream s);

// After a step (parallel/pipeline_report.cu): per rank, the busy time over the step's span and
// the bubble, gathered over the pp group (on every rank); the bubble the simulator predicts from the measured durations of
// every action (what the schedule would give if the ranks waited only for each other: ranks
// that share cores, or communication, make the measured one larger); and the schedule's formula.
// With `timeline`, also an ASCII picture of the step, one line per rank, `width` columns, and
// the actions it draws with their times.
struct PipelineReport {
  std::vector<double> busy_ms;  // per pp rank: time spent in compute actions
  double span_ms = 0;           // first action's start to the last one's end, over the ranks
  double bubble = 0;            // 1 - mean busy / span
  double bubble_predicted = 0;  // the simulator's, from the measured durations (rendezvous)
  double bubble_formula = 0;    // the schedule's at equal costs (pipeline_schedule_bubble)
  std::string timeline;  // one line per rank, drawn (when asked for)
  std::string actions;   // one line per rank: each compute action, its start and end (ditto)
};
// Reads the last step's events first (waits for them: a report is not part of a step).
PipelineReport pipeline_report(Pipeline& pl, bool timeline, int width = 96);
