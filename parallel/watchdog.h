// parallel/watchdog.h - a deadline on every wait for other ranks: [parallel] timeout_s.
//
// A rank that stops (SIGSTOP, a hung GPU, a node the network has not yet declared dead) leaves
// the others waiting in a collective forever. The watchdog ends the job instead, naming the rank
// that waited (FATAL's "[rank r]"), the operation, the axis and the step:
//
//   [rank 0] error: watchdog: all-reduce on axis dp (2 ranks) at step 14 has waited 3.0 s,
//   longer than [parallel] timeout_s = 3: another rank of the group stopped, died or is far
//   behind
//
// MPI backend (parallel/comm_mpi.cu, comm_mpi_runtime.cu): every call is nonblocking
//   (MPI_Iallreduce, MPI_Isend, ...) and waited for by mpi_wait: MPI_Testall (which also drives
//   the operation), then a sleep that grows from 20 us to 1 ms while nothing completes, so a
//   waiting rank sleeps instead of spinning a core; a wait that outlasts the deadline ends in
//   FATAL, whose MPI_Abort makes mpirun (or srun) end every rank, the stopped one too. The data
//   plane and the host helpers alike.
// NCCL backend (parallel/comm_nccl.cu): the host does not wait in NCCL calls (they are queued
//   on a stream), so a thread watches: each queued operation is followed by an event, and the
//   thread polls the oldest unfinished one and ncclCommGetAsyncError of every communicator; past
//   the deadline (or on an asynchronous error) it prints the message, calls ncclCommAbort on
//   every communicator so that the GPU's kernels stop waiting, and aborts the job.
// Not covered: making the groups at start-up (once, before the first step).
//
// The watchdog also measures the time this rank spent waiting in MPI calls (`waited_s`): the
// straggler report (training/health.h) subtracts it from the step time.
#pragma once
#include <cstdint>

struct Watchdog {
  double timeout_s = 0;  // 0: no deadline
  int64_t step = 0;      // the trainer's step, for the message (set before each step)
  double waited_s = 0;   // seconds spent in MPI waits so far (main thread only)
  void* nccl = nullptr;  // the NCCL backend's watching thread (parallel/comm_nccl.cu)
};
