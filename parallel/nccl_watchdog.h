// parallel/nccl_watchdog.h - the NCCL backend's side of the watchdog (parallel/watchdog.h), used
// by parallel/comm_nccl.cu only: a thread that watches the operations queued on streams.
//
// An NCCL call returns as soon as its kernel is queued, so the host never waits in one; a rank
// whose peer stopped waits in the GPU, and the host later blocks in a stream synchronisation it
// cannot leave. So each operation is tracked: nccl_watch_begin before the call (a call that does
// block on the host, as the emulated build's stand-in does, is then watched too), and
// nccl_watch_queued after it, which records an event on the stream. A thread polls the oldest
// unfinished operation's event and every communicator's ncclCommGetAsyncError; an operation
// older than [parallel] timeout_s, or an asynchronous error, makes it call ncclCommAbort on every
// communicator (the kernels stop waiting) and stop the job with a message naming the rank, the
// operation, the axis and the step it was queued at (FATAL from the watching thread: MPI_Abort
// there is beyond MPI_THREAD_FUNNELED's promise, but it is how Open MPI and MPICH reach the
// launcher, and nothing else on this rank can end the job while its main thread is stuck).
//
// Without a deadline (timeout_s = 0, or no Watchdog) nothing is tracked and no thread runs.
// An operation queued while its stream captures a CUDA graph ([kernels] cuda_graph,
// training/cuda_graph.h) is not tracked: an event recorded in a capture marks nothing the host
// can query, so the collectives of a replayed step are not watched.
#pragma once
#include <cstdint>

#include "parallel/comm.h"

// A communicator of c's group joins (leaves) the watched set; the first one starts the thread,
// the last one stops it.
void nccl_watch_register(Comm& c, void* nccl_comm);
void nccl_watch_unregister(Comm& c, void* nccl_comm);
// Around every NCCL call on c: begin returns a ticket, queued records the operation's event on s.
uint64_t nccl_watch_begin(Comm& c, const char* op);
void nccl_watch_queued(Comm& c, uint64_t ticket, ops::Stream s);
