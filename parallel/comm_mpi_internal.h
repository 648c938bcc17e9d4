// parallel/comm_mpi_internal.h - what the two files of the MPI backend share
// (parallel/comm_mpi.cu: the collectives; parallel/comm_mpi_runtime.cu: start-up, groups, the
// host side): the MPI communicator behind a Comm. Nothing else includes <mpi.h>.
#pragma once
#include <mpi.h>

#include <string>

#include "parallel/comm.h"

// The group's MPI communicator (Comm::mpi points to one, made by comm_create).
inline MPI_Comm mpi_group(const Comm& c) {
  CHECK(c.mpi, "axis %s has no MPI communicator", axis_name(c.axis));
  return *static_cast<const MPI_Comm*>(c.mpi);
}

// Waits for n requests of group c under the watchdog (parallel/watchdog.h): MPI_Testall, then a
// growing sleep while nothing completes; past [parallel] timeout_s the job stops with a message
// naming `op`, the axis and the step. `statuses` may be MPI_STATUSES_IGNORE.
void mpi_wait(Comm& c, int n, MPI_Request* requests, MPI_Status* statuses, const char* op);
