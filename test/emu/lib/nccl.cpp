// test/emu/lib/nccl.cpp - the NCCL stand-in of the emulated CUDA build, over MPI: the functions
// nccl.h declares that parallel/comm_nccl.cu calls, on host memory (emulated device memory is
// host memory). This file: unique ids and communicators, ncclGroupStart/End, ncclSend/ncclRecv,
// the error strings. The collectives are in nccl_collectives.cpp.
//
// Streams. Every call is queued on its stream (test/emu/include/emu_streams.h) as work that
// posts non-blocking MPI transfers and finishes once they complete, so the emulated runtime can
// run the rank's other streams while it waits for the other ranks, as a GPU runs them beside it.
// Messages match by tag: each communicator counts its collectives, and its sends to and receives
// from each peer, when they are called (the order NCCL requires every member to keep), and the
// tag carries that serial number, whatever order the streams run them in. Inside
// ncclGroupStart/End sends and receives are only queued; the outermost ncclGroupEnd queues, per
// stream, one piece of work posting the receives, then the sends, finished once all complete: a
// pipeline stage that sends to one neighbour and receives from the other in one group therefore
// cannot deadlock, whatever the message sizes. A send to oneself outside a group is refused.
//
// Communicators from a unique id, with nothing collective over MPI_COMM_WORLD (only the members
// call ncclCommInitRank: a middle pipeline stage never joins the "embed" group of the first and
// the last). ncclGetUniqueId writes into the id the drawing process's world rank and a serial
// number of its own; from (root, serial) every member derives the same MPI tag. Each member
// sends (its world rank, its NCCL rank, nranks) to the root with that tag on MPI_COMM_WORLD; the
// root collects nranks - 1 of them, checks that the ranks are distinct and the sizes agree, and
// answers every member with the list of world ranks in NCCL rank order (or a refusal); then the
// members alone call MPI_Comm_create_group over that list, with the same tag. The root must be
// a member (as in parallel/comm_nccl.cu, where group rank 0 draws the id); NCCL would also
// accept an id drawn by an outsider, the stand-in would wait for it forever. Tags live in the
// upper half of MPI_TAG_UB, away from any tag the project uses. Several emulated ranks may share
// the one pretend GPU: nothing here looks at devices.
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "test/emu/include/emu_streams.h"
#include "test/emu/include/emu_counts.h"
#include "test/emu/lib/nccl_state.h"

namespace nccl_standin {
namespace {

// The process-wide state NCCL also keeps per thread: the last error, the group nesting and the
// transfers queued inside it, the serial number of the ids this process drew.
struct Pending {
  bool is_send;
  void* buf;
  size_t bytes;
  int peer;
  ncclComm* comm;
  cudaStream_t stream;
  uint64_t serial;  // of the sends to (receives from) this peer on this communicator
};
struct State {
  std::string last_error;
  int group_depth = 0;
  std::vector<Pending> queued;
  unsigned long long ids_drawn = 0;
};
State& state() {
  static State s;
  return s;
}

// What a unique id carries.
struct IdContents {
  char magic[16];
  int root;        // world rank of the process that drew it
  int world_size;  // of that process's MPI_COMM_WORLD, to catch an id from another job
  unsigned long long serial;
};
static_assert(sizeof(IdContents) <= NCCL_UNIQUE_ID_BYTES, "the id holds its contents");
constexpr char kIdMagic[16] = "gpt5d-emu-nccl";

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

// The tag of the id's registration and MPI_Comm_create_group: distinct per (root, serial) up to
// a span of the tag space that no training run exhausts.
int tag_of(const IdContents& id) {
  int* upper = nullptr;
  int found = 0;
  MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &upper, &found);
  const long long ub = found ? *upper : 32767;
  const long long span = ub / 2;
  return (int)(ub / 2 + (long long)((id.serial * (unsigned long long)id.world_size + id.root) %
                                    (unsigned long long)span));
}

// The root's side: collect the other members' registrations and answer them. reply[0] is 1 if
// the members agree, reply[1 + r] the world rank of NCCL rank r.
void gather_members(std::vector<int>& reply, int nranks, int rank, int tag) {
  reply.assign(nranks + 1, -1);
  reply[0] = 1;
  reply[1 + rank] = world_rank();
  std::vector<int> senders;
  for (int i = 0; i < nranks - 1; i++) {
    int msg[3];
    MPI_Recv(msg, 3, MPI_INT, MPI_ANY_SOURCE, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    senders.push_back(msg[0]);
    if (msg[2] != nranks || msg[1] < 0 || msg[1] >= nranks || reply[1 + msg[1]] != -1)
      reply[0] = 0;
    else
      reply[1 + msg[1]] = msg[0];
  }
  for (int w : senders) MPI_Send(reply.data(), nranks + 1, MPI_INT, w, tag, MPI_COMM_WORLD);
}

ncclResult_t read_id(const ncclUniqueId& raw, IdContents* id) {
  int initialized = 0, size = 0;
  MPI_Initialized(&initialized);
  if (!initialized) return fail(ncclInvalidUsage, "MPI is not initialized (the stand-in runs over MPI)");
  std::memcpy(id, raw.internal, sizeof(*id));
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (std::memcmp(id->magic, kIdMagic, sizeof(kIdMagic)) != 0 || id->world_size != size ||
      id->root < 0 || id->root >= size)
    return fail(ncclInvalidArgument, "the unique id was not drawn by ncclGetUniqueId in this job");
  return ncclSuccess;
}

}  // namespace

ncclResult_t fail(ncclResult_t r, const std::string& what) {
  state().last_error = "NCCL stand-in: " + what;
  std::fprintf(stderr, "%s\n", state().last_error.c_str());
  return r;
}

ncclComm* comm_of(ncclComm_t comm, const char* function) {
  if (comm && comm->magic == kCommMagic && !comm->aborted) return comm;
  fail(ncclInvalidArgument, std::string(function) + (comm && comm->magic == kCommMagic
                                                         ? ": the communicator was aborted"
                                                         : ": not a communicator"));
  return nullptr;
}

size_t type_size(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
  }
}

bool inside_group() { return state().group_depth > 0; }

int tag_of(TagKind kind, uint64_t serial) {
  static const uint64_t span = [] {
    int* upper = nullptr;
    int found = 0;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &upper, &found);
    return (uint64_t)((found ? *upper : 32767) - 1) / 3;
  }();
  return (int)(1 + (serial % span) * 3 + (uint64_t)kind);
}

void Transfers::send(const void* buf, size_t bytes, int peer, int tag, MPI_Comm comm) {
  requests.emplace_back();
  MPI_Isend(buf, (int)bytes, MPI_BYTE, peer, tag, comm, &requests.back());
}
void Transfers::recv(void* buf, size_t bytes, int peer, int tag, MPI_Comm comm) {
  requests.emplace_back();
  MPI_Irecv(buf, (int)bytes, MPI_BYTE, peer, tag, comm, &requests.back());
}
bool Transfers::complete(std::vector<MPI_Status>* statuses) {
  if (requests.empty()) return true;
  std::vector<MPI_Status> st(requests.size());
  int done = 0;
  MPI_Testall((int)requests.size(), requests.data(), &done, st.data());
  if (done && statuses) *statuses = st;
  return done != 0;
}

bool overlaps(const void* a, size_t an, const void* b, size_t bn) {
  const char *pa = static_cast<const char*>(a), *pb = static_cast<const char*>(b);
  return an > 0 && bn > 0 && pa < pb + bn && pb < pa + an;
}

}  // namespace nccl_standin

using namespace nccl_standin;

// ---------------------------------------------------------------------------------------------
// Unique ids and communicators
// ---------------------------------------------------------------------------------------------
ncclResult_t ncclGetUniqueId(ncclUniqueId* out) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!out) return fail(ncclInvalidArgument, "ncclGetUniqueId: null id");
  if (!initialized) return fail(ncclInvalidUsage, "MPI is not initialized (the stand-in runs over MPI)");
  IdContents id{};
  std::memcpy(id.magic, kIdMagic, sizeof(kIdMagic));
  id.root = world_rank();
  MPI_Comm_size(MPI_COMM_WORLD, &id.world_size);
  id.serial = state().ids_drawn++;
  std::memset(out, 0, sizeof(*out));
  std::memcpy(out->internal, &id, sizeof(id));
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId raw, int rank) {
  IdContents id;
  ncclResult_t r = read_id(raw, &id);
  if (r != ncclSuccess) return r;
  if (!comm || nranks < 1 || rank < 0 || rank >= nranks)
    return fail(ncclInvalidArgument, "ncclCommInitRank: rank " + std::to_string(rank) + " of " +
                                         std::to_string(nranks));
  if (inside_group()) return fail(ncclInvalidUsage, "ncclCommInitRank inside a group is not implemented");
  const int tag = tag_of(id);
  std::vector<int> reply(nranks + 1);
  if (world_rank() == id.root) {
    gather_members(reply, nranks, rank, tag);
  } else {
    int msg[3] = {world_rank(), rank, nranks};
    MPI_Send(msg, 3, MPI_INT, id.root, tag, MPI_COMM_WORLD);
    MPI_Recv(reply.data(), nranks + 1, MPI_INT, id.root, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  }
  if (reply[0] != 1)
    return fail(ncclInvalidUsage, "ncclCommInitRank: the members disagree on nranks or share a rank");
  MPI_Group world, members;
  MPI_Comm_group(MPI_COMM_WORLD, &world);
  MPI_Group_incl(world, nranks, reply.data() + 1, &members);
  MPI_Comm mpi = MPI_COMM_NULL;
  MPI_Comm_create_group(MPI_COMM_WORLD, members, tag, &mpi);
  MPI_Group_free(&members);
  MPI_Group_free(&world);
  *comm = new ncclComm{kCommMagic, mpi, rank, nranks, false, 0,
                       std::vector<uint64_t>(nranks, 0), std::vector<uint64_t>(nranks, 0)};
  return ncclSuccess;
}

// NCCL frees the communicator and stops its unfinished operations. The stand-in runs operations
// on the host thread that called them, which may still be inside one (the watchdog aborts from
// another thread, parallel/nccl_watchdog.cu), so it only marks the communicator aborted: any
// later call on it is refused, and its memory and MPI communicator are left to the process's
// exit (which is what follows an abort). No MPI call: it may run beside the calling thread's.
ncclResult_t ncclCommAbort(ncclComm_t handle) {
  ncclComm* comm = comm_of(handle, "ncclCommAbort");
  if (!comm) return ncclInvalidArgument;
  comm->aborted = true;
  return ncclSuccess;
}

// The stand-in's operations either complete or stop the job (MPI's error handler): there is never
// an asynchronous error to report.
ncclResult_t ncclCommGetAsyncError(ncclComm_t handle, ncclResult_t* async_error) {
  ncclComm* comm = comm_of(handle, "ncclCommGetAsyncError");
  if (!comm || !async_error) return ncclInvalidArgument;
  *async_error = ncclSuccess;
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t handle) {
  ncclComm* comm = comm_of(handle, "ncclCommDestroy");
  if (!comm) return ncclInvalidArgument;
  for (const Pending& p : state().queued)
    if (p.comm == comm) return fail(ncclInvalidUsage, "ncclCommDestroy with transfers queued in a group");
  MPI_Comm_free(&comm->mpi);
  comm->magic = 0;
  delete comm;
  return ncclSuccess;
}

// ---------------------------------------------------------------------------------------------
// Groups, send and receive
// ---------------------------------------------------------------------------------------------
namespace {

ncclResult_t check_p2p(ncclComm* comm, size_t count, ncclDataType_t dt, int peer, const void* buf,
                       const char* function) {
  if (!comm) return ncclInvalidArgument;
  if (type_size(dt) == 0) return fail(ncclInvalidArgument, std::string(function) + ": data type");
  if (peer < 0 || peer >= comm->nranks)
    return fail(ncclInvalidArgument, std::string(function) + ": peer " + std::to_string(peer) +
                                         " of " + std::to_string(comm->nranks));
  if (count > 0 && !buf) return fail(ncclInvalidArgument, std::string(function) + ": null buffer");
  if ((count * type_size(dt)) > (size_t)0x7fffffff)
    return fail(ncclInvalidUsage, std::string(function) + ": messages over 2 GiB are not implemented");
  if (!inside_group() && peer == comm->rank)
    return fail(ncclInvalidUsage, std::string(function) + " to oneself outside a group never completes");
  return ncclSuccess;
}

// A received message must be exactly the size posted (NCCL would hang or corrupt memory).
ncclResult_t check_received(const MPI_Status& status, size_t bytes, int peer) {
  int got = 0;
  MPI_Get_count(&status, MPI_BYTE, &got);
  if ((size_t)got == bytes) return ncclSuccess;
  return fail(ncclInvalidUsage, "ncclRecv of " + std::to_string(bytes) + " bytes from peer " +
                                    std::to_string(peer) + " matched a send of " +
                                    std::to_string(got));
}

// Sends and receives as one piece of stream work: the first step posts the receives, then the
// sends; the work is done once all have completed. A receive of another size than its send
// sets *result (the stand-ins' tests, which run work at once, see it as the call's result); on
// an emulated stream, where the call returned long ago, it stops the job (NCCL would hang or
// corrupt memory).
emu::StreamWork transfer_work(std::vector<Pending> ops, std::shared_ptr<ncclResult_t> result) {
  auto transfers = std::make_shared<Transfers>();
  auto posted = std::make_shared<bool>(false);
  return [ops, transfers, posted, result]() {
    if (!*posted) {
      *posted = true;
      for (const Pending& p : ops)  // EMU_COUNTS: each message's bytes, counted by its sender
        if (p.is_send) emu::note_library_call({"ncclSend", 0, 0, 0, (double)p.bytes});
      for (int pass = 0; pass < 2; pass++)
        for (const Pending& p : ops) {
          if (p.is_send != (pass == 1)) continue;
          const int tag = tag_of(kTagP2P, p.serial);
          if (p.is_send)
            transfers->send(p.buf, p.bytes, p.peer, tag, p.comm->mpi);
          else
            transfers->recv(p.buf, p.bytes, p.peer, tag, p.comm->mpi);
        }
    }
    std::vector<MPI_Status> statuses;
    if (!transfers->complete(&statuses)) return false;
    size_t i = 0;
    for (int pass = 0; pass < 2; pass++)
      for (const Pending& p : ops) {
        if (p.is_send != (pass == 1)) continue;
        if (!p.is_send && check_received(statuses[i], p.bytes, p.peer) != ncclSuccess) {
          *result = ncclInvalidUsage;
          if (emu::enqueue_work) MPI_Abort(MPI_COMM_WORLD, 1);
        }
        i++;
      }
    return true;
  };
}

// The sends and receives as work made now, with the serial numbers the calls took, and again
// for each replay of a captured graph (test/emu/graphs.cpp) with the next ones: each replay's
// messages are new ones.
emu::WorkMaker transfer_maker(std::vector<Pending> ops, std::shared_ptr<ncclResult_t> result) {
  auto made = std::make_shared<bool>(false);
  return [ops, result, made]() mutable {
    if (*made)
      for (Pending& p : ops) p.serial = p.is_send ? p.comm->sent[p.peer]++ : p.comm->received[p.peer]++;
    *made = true;
    return transfer_work(ops, result);
  };
}

// A send or receive outside a group.
ncclResult_t submit_alone(cudaStream_t stream, const char* what, const Pending& p) {
  auto result = std::make_shared<ncclResult_t>(ncclSuccess);
  emu::submit_made(stream, what, transfer_maker({p}, result));
  return *result;
}

// The group's sends and receives, one piece of work per stream (in the order of first use).
ncclResult_t run_queued() {
  std::vector<Pending> ops;
  ops.swap(state().queued);
  auto result = std::make_shared<ncclResult_t>(ncclSuccess);
  std::vector<cudaStream_t> order;
  for (const Pending& p : ops) {
    bool seen = false;
    for (cudaStream_t s : order) seen = seen || s == p.stream;
    if (!seen) order.push_back(p.stream);
  }
  for (cudaStream_t s : order) {
    std::vector<Pending> mine;
    for (const Pending& p : ops)
      if (p.stream == s) mine.push_back(p);
    emu::submit_made(s, "ncclGroupEnd", transfer_maker(mine, result));
  }
  return *result;
}

}  // namespace

ncclResult_t ncclGroupStart() {
  state().group_depth++;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  if (state().group_depth == 0) return fail(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  if (--state().group_depth > 0) return ncclSuccess;
  return run_queued();
}

ncclResult_t ncclSend(const void* buf, size_t count, ncclDataType_t dt, int peer, ncclComm_t handle,
                      cudaStream_t stream) {
  ncclComm* comm = comm_of(handle, "ncclSend");
  ncclResult_t r = check_p2p(comm, count, dt, peer, buf, "ncclSend");
  if (r != ncclSuccess) return r;
  const size_t bytes = count * type_size(dt);
  Pending p{true, const_cast<void*>(buf), bytes, peer, comm, stream, comm->sent[peer]++};
  if (inside_group())
    state().queued.push_back(p);
  else
    return submit_alone(stream, "ncclSend", p);
  return ncclSuccess;
}

ncclResult_t ncclRecv(void* buf, size_t count, ncclDataType_t dt, int peer, ncclComm_t handle,
                      cudaStream_t stream) {
  ncclComm* comm = comm_of(handle, "ncclRecv");
  ncclResult_t r = check_p2p(comm, count, dt, peer, buf, "ncclRecv");
  if (r != ncclSuccess) return r;
  const size_t bytes = count * type_size(dt);
  Pending p{false, buf, bytes, peer, comm, stream, comm->received[peer]++};
  if (inside_group())
    state().queued.push_back(p);
  else
    return submit_alone(stream, "ncclRecv", p);
  return ncclSuccess;
}

// ---------------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------------
const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

const char* ncclGetLastError(ncclComm_t comm) { return state().last_error.c_str(); }
