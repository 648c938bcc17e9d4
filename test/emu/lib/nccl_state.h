// test/emu/lib/nccl_state.h - what the NCCL stand-in shares between its two files:
// test/emu/lib/nccl.cpp (communicators from a unique id, groups, send/recv, errors) and
// test/emu/lib/nccl_collectives.cpp (all-reduce, reduce-scatter, all-gather, broadcast).
// test/emu/LIBRARIES.md explains the design.
#pragma once
#include <mpi.h>
#include <nccl.h>

#include <cstddef>
#include <string>

// A communicator: an MPI communicator over the members, ranked as NCCL ranks them.
struct ncclComm {
  unsigned magic;
  MPI_Comm mpi;
  int rank, nranks;
  bool aborted;  // ncclCommAbort was called (nccl.cpp)
};

namespace nccl_standin {

constexpr unsigned kCommMagic = 0x4e43434c;  // "NCCL"

// Records the message for ncclGetLastError, prints "NCCL stand-in: <what>" and returns r.
ncclResult_t fail(ncclResult_t r, const std::string& what);

// The communicator behind a handle, or nullptr (after recording the error) if it is not one.
ncclComm* comm_of(ncclComm_t comm, const char* function);

// Bytes of one element of t (0 for a value that is not an NCCL type).
size_t type_size(ncclDataType_t t);

// Whether ncclGroupStart has been called more often than ncclGroupEnd.
bool inside_group();

// Whether the byte ranges [a, a + an) and [b, b + bn) share a byte.
bool overlaps(const void* a, size_t an, const void* b, size_t bn);

}  // namespace nccl_standin
