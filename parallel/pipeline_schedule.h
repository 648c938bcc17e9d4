// parallel/pipeline_schedule.h - pipeline schedules as data: for p pipeline ranks, m micro-batches
// and v model chunks per rank, the ordered list of actions each rank performs in one optimizer
// step (compute, and the sends and receives of the tensors at stage boundaries), and a simulator
// that runs those lists against each other, with sends that complete at once (buffered) or only
// once the peer posts the receive (rendezvous, as NCCL and large MPI messages do). Pure logic: no
// communication, no model. Four files, one idea each:
//   parallel/pipeline_schedule.cu   the schedules, their stage orders and the builder
//   parallel/pipeline_messages.cu   where the sends and receives go, so rendezvous never stalls
//   parallel/pipeline_simulator.cu  the simulator and the ASCII timeline
//   parallel/pipeline_file.cu       a user's schedule read from a file, and its checks
// The bubble, the warm-ups and the two ways of sending are derived in docs/PARALLELISM.md.
//
// Stages. The model's n_layer blocks are cut into S = p*v stages of consecutive blocks, numbered
// in model order (how many blocks each: [parallel] pp_layers, or equal). Which rank and chunk
// hold stage s is the schedule's stage order (StageOrder): Loop puts chunk c of rank r at stage
// c*p + r (v = 1: rank r holds stage r; v = 2, p = 4: rank 0 holds stages 0 and 4), V puts
// chunk 0 of rank r at stage r and chunk 1 at stage 2p-1-r (v = 2: the model goes down the ranks
// and back up, so rank p-1 holds stages p-1 and p, and rank 0 the first and the last). Stage s
// gets its input from stage s-1 and its output gradient from stage s+1; the last stage computes
// the loss.
//
// The backward in two. A schedule may split every backward into its input-gradient part B (on
// the critical path: stage s-1 waits for it) and its weight-gradient part W (needed by nobody but
// the optimizer, so it can move into the bubble): zero-bubble schedules (Qi et al. 2023). Such a
// schedule has a Weight action per (micro-batch, chunk), after its Backward; in one without, a
// Backward is the whole backward.
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "config/config.h"

enum class PipeOp : int {
  Forward = 0,   // forward of (micro, chunk): input from stage s-1 (or the data at stage 0)
  Backward,      // backward of (micro, chunk): output gradient from stage s+1 (or the loss);
                 // only its input-gradient part B when the schedule splits backwards
  Weight,        // the weight-gradient part W of (micro, chunk)'s backward (split schedules)
  SendForward,   // send the output activation of (micro, chunk) to peer (stage s+1)
  RecvForward,   // receive the input activation of (micro, chunk) from peer (stage s-1)
  SendBackward,  // send the input gradient of (micro, chunk) to peer (stage s-1)
  RecvBackward,  // receive the output gradient of (micro, chunk) from peer (stage s+1)
};
// "F", "B", "W", "send-fwd", "recv-fwd", "send-bwd", "recv-bwd"
const char* pipe_op_name(PipeOp op);

// One action of one rank. chunk is this rank's chunk (its stage is given by the stage order) in
// every case: a send names the chunk that produced the tensor, a receive the chunk that will
// consume it. peer is the pipeline rank at the other end of a send or receive, -1 for compute.
// line: where a user's schedule file wrote it (its sends and receives: the line of the compute
// they serve), 0 for built schedules.
struct PipeAction {
  PipeOp op;
  int micro;
  int chunk;
  int peer;
  int line = 0;
};

enum class StageOrder { Loop, V };

struct PipelineSchedule {
  std::string kind;  // "gpipe", "1f1b", "interleaved", "zb-h1", "zb-v" or "file:PATH"
  int p = 1, m = 1, v = 1;
  StageOrder order = StageOrder::Loop;
  bool split = false;  // backwards split into B and W (the lists hold Weight actions)
  std::vector<std::vector<PipeAction>> ranks;  // ranks[r]: rank r's actions, in order

  int stage(int rank, int chunk) const;  // the stage chunk `chunk` of rank `rank` holds
  int owner(int stage) const;            // the rank holding stage s
  int chunk_of(int stage) const;         // its chunk there
};
// The same three for an order without a schedule (the model's layout).
int pipeline_stage(StageOrder order, int p, int rank, int chunk);
int pipeline_stage_owner(StageOrder order, int p, int stage);
int pipeline_stage_chunk(StageOrder order, int p, int stage);
StageOrder pipeline_stage_order(const std::string& kind);  // zb-v: V; files: their `order` line

// ---------------------------------------------------------------------------------------------
// The schedules and the builder (parallel/pipeline_schedule.cu)
// ---------------------------------------------------------------------------------------------
// The rules of (kind, p, m, v) are config/layout_rules.cu's pipeline_rules: a config that breaks
// them is refused when it is read.
// The schedule; stops the job (FATAL) on a configuration pipeline_rules refuses. Every send
// and receive sits where the lists run under rendezvous too (pipeline_place_messages): at a
// moment both ranks are between computes in the timeline at the nominal costs F = B = W = 1. A
// "file:PATH" kind reads the file (parallel/pipeline_file.cu).
PipelineSchedule pipeline_build(const std::string& kind, int p, int m, int v);

// The compute actions of one rank (F, B, W: the op, micro-batch and chunk; peer -1; line) with
// the receive of each input right before it and the send of each output right after it, where
// the neighbouring stage is on another rank: how every schedule's lists start, before
// pipeline_place_messages moves the messages.
std::vector<PipeAction> pipeline_with_messages(const PipelineSchedule& s, int rank,
                                               const std::vector<PipeAction>& computes);

bool pipe_op_is_comm(PipeOp op);  // the four sends and receives
bool pipe_op_is_send(PipeOp op);  // SendForward or SendBackward
bool pipe_op_is_forward_message(PipeOp op);  // SendForward or RecvForward: an activation

// Messages between two ranks match per channel: the activations a chunk sends, and the gradients
// a chunk sends, are each one ordered stream (so at p = 2 the activations of chunk 0, those of
// chunk 1 and the gradients need not interleave in the same order on both ends). The channel of
// send or receive action a of rank `rank`, in [0, 2v): what the transport uses as the tag.
int pipeline_channel(const PipelineSchedule& s, int rank, const PipeAction& a);

// The idle fraction of a step with equal stages and free communication, for the unsplit
// schedules: (p-1)/(v*m+p-1). See pipeline_schedule_bubble for every schedule.
double pipeline_bubble(int p, int m, int v);
// The bubble fraction each schedule's formula gives at the nominal costs F = B = W = 1 per chunk
// (pipeline_schedule.cu derives them; the simulator reproduces them exactly):
//   gpipe, 1f1b, interleaved  (p-1)/(v*m + p-1)
//   zb-h1                     1 - 3m / max(3m + p - 1, 2m + 2p - 1)
//   zb-v                      1 - 6m / (6m + max(p - 1, 2(2p - 1 - m)))
// A user's schedule has no formula: 0 (the simulator gives its bubble).
double pipeline_schedule_bubble(const std::string& kind, int p, int m, int v);
// The most chunk activations rank r holds at once (forwards whose backward, or weight pass when
// split, has not run), by the schedule's formula:
//   gpipe m;  1f1b min(p - r, m);  interleaved min((p-r-1) + (v-1)*p + 1, m*v);
//   zb-h1 min(p, m);  zb-v min(m + 1 + r, 2m, 2p).   -1 for a user's schedule.
int pipeline_peak_formula(const std::string& kind, int p, int m, int v, int rank);

// The runs of consecutive sends and receives in one rank's list, as [begin, end) action indices,
// in order. The executor posts each run as one batched operation (an NCCL group, or MPI
// Isend/Irecv and one Waitall) that returns when all of it has completed; the rendezvous
// simulation below groups the same way.
std::vector<std::pair<size_t, size_t>> pipeline_comm_runs(const std::vector<PipeAction>& actions);

// ---------------------------------------------------------------------------------------------
// Where the messages go (parallel/pipeline_messages.cu)
// ---------------------------------------------------------------------------------------------
// Moves the sends and receives of s (p > 1) to places where both ends are between computes at the
// same time in the timeline at the nominal costs, keeping the computes and the order of the
// messages of every channel. pipeline_build calls it last. On the interleaved schedule's link
// from rank p-1 to rank 0 that puts some receives several computes before their consumer (more as
// p grows) and some sends one compute late; elsewhere a receive stays right before its compute
// and a send right after. Returns "" or why a message finds no such place (or why the lists do
// not run at all); pipeline_place_messages stops the job instead.
std::string pipeline_try_place_messages(PipelineSchedule& s);
void pipeline_place_messages(PipelineSchedule& s);

// ---------------------------------------------------------------------------------------------
// The simulator (parallel/pipeline_simulator.cu)
// ---------------------------------------------------------------------------------------------
// How a send completes, in the simulation. Communication itself is free in both.
//   Buffered:   at once: the message waits in a first-in first-out queue per channel of an
//               ordered pair of ranks, and a receive waits for the matching send. Small MPI
//               messages behave so.
//   Rendezvous: only when the peer has posted the matching receive. A rank reaching a run of
//               sends and receives (pipeline_comm_runs) posts all of them at its clock, and
//               goes on when every one is matched, at the latest post time among them and their
//               partners. NCCL and large MPI messages behave so: a list that is fine buffered
//               can deadlock here (two ranks each sending to the other in a run of its own
//               before receiving), and the executor runs the lists this way.
// Either way sends and receives between two ranks match in posting order per channel
// (pipeline_channel), which is exactly what the transports do: MPI by tag, NCCL per
// communicator (parallel/comm.h).
enum class PipeComm { Buffered, Rendezvous };

// The costs of the compute actions: per chunk, the forward F, the backward's input-gradient
// part B and its weight-gradient part W; an unsplit schedule's Backward costs B + W. The nominal
// costs F = B = W = 1 are the zero-bubble paper's assumption and what the message placement is
// exact for (an unsplit backward then costs 2F, the usual assumption). `measured`, when not
// empty: per rank, the duration of each of its compute actions in list order, instead (the
// executor's timings, to predict the bubble of the step it measured).
struct PipeCosts {
  double F = 1, B = 1, W = 1;
  std::vector<std::vector<double>> measured;
};

// The result of running the lists against each other with the given costs and free,
// instantaneous communication of the given kind.
struct PipelineSimulation {
  std::string error;          // "" or: deadlock (the cycle of ranks waiting for each other, and
                              // the action each waits on), a message that does not match the
                              // receive, a compute without its input
  double makespan = 0;        // time when the last rank finishes
  std::vector<double> busy;   // per rank: time spent computing (m*v*(F+B+W) when all is well)
  std::vector<int> peak_live; // per rank: most chunk activations held at once (forwards done
                              // whose backward - weight pass, when split - is not)
  // per rank: the compute actions with their start and end times, in order (for timelines)
  std::vector<std::vector<std::pair<double, PipeAction>>> starts;
  std::vector<std::vector<double>> ends;
  double bubble() const;      // 1 - mean busy / makespan
};
PipelineSimulation pipeline_simulate(const PipelineSchedule& sched, const PipeCosts& costs,
                                     PipeComm mode = PipeComm::Buffered);

// ASCII timeline of a simulation with integer costs: one column pair per time unit, "F3" style
// labels (micro-batch in hex; chunks after the first drawn in lower case f/b/w), "==" for the rest
// of an action, "." when idle. One line per rank.
std::string pipeline_timeline(const PipelineSchedule& sched, const PipelineSimulation& sim);

// ---------------------------------------------------------------------------------------------
// A user's schedule (parallel/pipeline_file.cu)
// ---------------------------------------------------------------------------------------------
// pp_schedule = "file:PATH": one action per line, `rank,action,micro,chunk` (action F, B or W;
// each rank's lines in the order it runs them; `#` starts a comment; an optional line
// `order,loop` or `order,v` names the stage order, loop by default). Reads, checks and builds it
// (messages placed) for p ranks, m micro-batches and v chunks: "" and the schedule, or the
// problems, one per line, each naming the file, the line and the rule broken.
std::string pipeline_read_file(const std::string& path, int p, int m, int v,
                               PipelineSchedule* out);
// The checks of the config's schedule that need the simulator (a user's schedule file read and
// run, and that a split schedule is run without recompute): "" or one problem per line. The
// trainer and the planner hand it to load_config (config/config.h: LayoutCheck).
std::string pipeline_config_problems(const Config& cfg);
