// test/emu/lib/nccl_state.h - what the NCCL stand-in shares between its two files:
// test/emu/lib/nccl.cpp (communicators from a unique id, groups, send/recv, errors) and
// test/emu/lib/nccl_collectives.cpp (all-reduce, reduce-scatter, all-gather, broadcast).
// test/emu/LIBRARIES.md explains the design.
#pragma once
#include <mpi.h>
#include <nccl.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

// A communicator: an MPI communicator over the members, ranked as NCCL ranks them, and the
// serial numbers that match its operations across ranks (counted when an operation is called,
// i.e. in the order NCCL requires every member to call them): collectives, and sends to and
// receives from each peer. Each operation's MPI messages carry a tag made of its serial, so they
// match whatever order the emulated streams run the operations in.
struct ncclComm {
  unsigned magic;
  MPI_Comm mpi;
  int rank, nranks;
  bool aborted;  // ncclCommAbort was called (nccl.cpp)
  uint64_t collectives;
  std::vector<uint64_t> sent, received;  // per peer
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

// The MPI tag of message kind 0 (send/receive), 1 or 2 (a collective's two phases) of the
// operation with this serial number, on the communicator's own MPI communicator.
enum TagKind { kTagP2P = 0, kTagPhase1 = 1, kTagPhase2 = 2 };
int tag_of(TagKind kind, uint64_t serial);

// Posted MPI transfers; complete() tests them all (MPI progresses them meanwhile).
struct Transfers {
  std::vector<MPI_Request> requests;
  void send(const void* buf, size_t bytes, int peer, int tag, MPI_Comm comm);
  void recv(void* buf, size_t bytes, int peer, int tag, MPI_Comm comm);
  bool complete(std::vector<MPI_Status>* statuses = nullptr);
};

// Whether the byte ranges [a, a + an) and [b, b + bn) share a byte.
bool overlaps(const void* a, size_t an, const void* b, size_t bn);

}  // namespace nccl_standin
