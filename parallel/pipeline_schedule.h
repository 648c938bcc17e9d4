// parallel/pipeline_schedule.h - pipeline schedules as data: for p pipeline ranks, m micro-batches
// and v model chunks per rank, the ordered list of actions each rank performs in one optimizer
// step (compute, and the sends and receives of the tensors at stage boundaries), and a simulator
// that runs those lists against each other, with sends that complete at once (buffered) or only
// once the peer posts the receive (rendezvous, as NCCL and large MPI messages do). Pure logic: no
// communication, no model. Three files, one idea each:
//   parallel/pipeline_schedule.cu   the schedules, their rules and the builder
//   parallel/pipeline_messages.cu   where the sends and receives go, so rendezvous never stalls
//   parallel/pipeline_simulator.cu  the simulator and the ASCII timeline
// The bubble, the warm-ups and the two ways of sending are derived in docs/PARALLELISM.md.
//
// Stages. The model's n_layer blocks are cut into S = p*v stages of equal size, numbered in model
// order. Chunk c of rank r is stage c*p + r, so with v = 1 rank r holds stage r, and with v = 2 and
// p = 4 rank 0 holds stages 0 and 4, rank 1 stages 1 and 5, and so on. Stage s gets its input from
// stage s-1 and its output gradient from stage s+1; the last stage computes the loss.
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "config/config.h"

enum class PipeOp : int {
  Forward = 0,   // forward of (micro, chunk): input from stage s-1 (or the data at stage 0)
  Backward,      // backward of (micro, chunk): output gradient from stage s+1 (or the loss)
  SendForward,   // send the output activation of (micro, chunk) to peer (stage s+1)
  RecvForward,   // receive the input activation of (micro, chunk) from peer (stage s-1)
  SendBackward,  // send the input gradient of (micro, chunk) to peer (stage s-1)
  RecvBackward,  // receive the output gradient of (micro, chunk) from peer (stage s+1)
};
const char* pipe_op_name(PipeOp op);  // "F", "B", "send-fwd", "recv-fwd", "send-bwd", "recv-bwd"

// One action of one rank. chunk is this rank's chunk (its stage is chunk*p + rank) in every case:
// a send names the chunk that produced the tensor, a receive the chunk that will consume it.
// peer is the pipeline rank at the other end of a send or receive, -1 for compute.
struct PipeAction {
  PipeOp op;
  int micro;
  int chunk;
  int peer;
};

struct PipelineSchedule {
  std::string kind;  // "gpipe", "1f1b" or "interleaved"
  int p = 1, m = 1, v = 1;
  std::vector<std::vector<PipeAction>> ranks;  // ranks[r]: rank r's actions, in order
};

// ---------------------------------------------------------------------------------------------
// The schedules and the builder (parallel/pipeline_schedule.cu)
// ---------------------------------------------------------------------------------------------
// The rules of (kind, p, m, v) are config/layout_rules.cu's pipeline_rules: a config that breaks
// them is refused when it is read.
// The schedule; stops the job (FATAL) on a configuration pipeline_rules refuses. Every send
// and receive sits where the lists run under rendezvous too (pipeline_place_messages): at a
// moment both ranks are between computes in the timeline with F = 1, B = 2.
PipelineSchedule pipeline_build(const std::string& kind, int p, int m, int v);

// Warm-up forwards of rank r before its first backward (counted in chunk forwards):
//   gpipe: m*v (all of them);  1f1b: min(p - r - 1, m);
//   interleaved: min((p - r - 1) + (v - 1)*p, m*v)  (see pipeline_schedule.cu).
int pipeline_warmup(const std::string& kind, int p, int m, int v, int rank);

// Sends and receives are the four ops after Backward.
bool pipe_op_is_comm(PipeOp op);
bool pipe_op_is_send(PipeOp op);  // SendForward or SendBackward

// The idle fraction of a step with equal stages and free communication: (p-1)/(v*m+p-1).
double pipeline_bubble(int p, int m, int v);

// The runs of consecutive sends and receives in one rank's list, as [begin, end) action indices,
// in order. The executor posts each run as one batched operation (an NCCL group, or MPI
// Isend/Irecv and one Waitall) that returns when all of it has completed; the rendezvous
// simulation below groups the same way.
std::vector<std::pair<size_t, size_t>> pipeline_comm_runs(const std::vector<PipeAction>& actions);

// ---------------------------------------------------------------------------------------------
// Where the messages go (parallel/pipeline_messages.cu)
// ---------------------------------------------------------------------------------------------
// Moves the sends and receives of s (p > 1) to places where both ends are between computes at the
// same time in the timeline with F = 1, B = 2, keeping the computes and the order of the messages
// between any two ranks. pipeline_build calls it last. On the interleaved schedule's link from
// rank p-1 to rank 0 that puts some receives several computes before their consumer (more as p
// grows) and some sends one compute late; elsewhere a receive stays right before its compute and
// a send right after. Stops the job if a message finds no such place.
void pipeline_place_messages(PipelineSchedule& s);

// ---------------------------------------------------------------------------------------------
// The simulator (parallel/pipeline_simulator.cu)
// ---------------------------------------------------------------------------------------------
// How a send completes, in the simulation. Communication itself is free in both.
//   Buffered:   at once: the message waits in a first-in first-out queue per ordered pair of
//               ranks, and a receive waits for the matching send. Small MPI messages behave so.
//   Rendezvous: only when the peer has posted the matching receive. A rank reaching a run of
//               sends and receives (pipeline_comm_runs) posts all of them at its clock, and
//               goes on when every one is matched, at the latest post time among them and their
//               partners. NCCL and large MPI messages behave so: a list that is fine buffered
//               can deadlock here (two ranks each sending to the other in a run of its own
//               before receiving), and the executor runs the lists this way.
// Either way sends and receives between two ranks match in posting order, which is exactly what
// the real transports do: NCCL and the MPI backend (tag 0) pair them in posting order.
enum class PipeComm { Buffered, Rendezvous };

// The result of running the lists against each other with compute costs F (one chunk's forward)
// and B (one chunk's backward) and free, instantaneous communication of the given kind.
struct PipelineSimulation {
  std::string error;          // "" or: deadlock (each stuck rank and the action it waits on), a
                              // message that does not match the receive, a compute without its
                              // input
  double makespan = 0;        // time when the last rank finishes
  std::vector<double> busy;   // per rank: time spent computing (m*v*(F+B) when all is well)
  std::vector<int> peak_live; // per rank: most chunk activations held at once (forwards done
                              // whose backward is not)
  // per rank: the compute actions with their start times, in order (for timelines)
  std::vector<std::vector<std::pair<double, PipeAction>>> starts;
};
PipelineSimulation pipeline_simulate(const PipelineSchedule& sched, double F, double B,
                                     PipeComm mode = PipeComm::Buffered);

// ASCII timeline of a simulation with integer costs: one column per time unit, "F3" style labels
// (micro-batch in hex; chunk 1 drawn in lower case f/b), "." when idle. One line per rank.
std::string pipeline_timeline(const PipelineSchedule& sched, const PipelineSimulation& sim,
                              double F, double B);
