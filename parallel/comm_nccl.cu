// parallel/comm_nccl.cu - the NCCL backend of the collectives (see comm.h), compiled into ./train
// only. Buffers are GPU buffers; every call is queued on the caller's stream and returns at once
// (the host does not wait), so a collective orders with the kernels around it like one more
// kernel on that stream.
//
// Communicators: one ncclComm per group of two or more ranks, made collectively over the group
// (comm_create, parallel/comm_mpi_runtime.cu, calls nccl_create for every group of the mesh, in
// the same order on every rank): group rank 0 draws an ncclUniqueId, the MPI backend's host
// broadcast hands it to the group, and every member calls ncclCommInitRank. The device must
// already be selected (ops::device_init). NCCL refuses two ranks on one GPU; the error then says to use MPI.
//
// All-to-all is c.size send/recv pairs inside one ncclGroupStart/End, which NCCL runs
// concurrently; all-to-all-v the same with a size per peer, zero sizes left out.
// p2p_batch puts its ncclSends and ncclRecvs in one group: NCCL starts them together, so none
// waits for another's peer to be ready, and the group occupies the stream until all are done.
//
// Every operation is watched against [parallel] timeout_s by a thread (parallel/nccl_watchdog.h).
#include <nccl.h>

#include <cuda_runtime.h>

#include "parallel/comm.h"
#include "parallel/nccl_watchdog.h"

#define NCCL_CHECK(call)                                                                      \
  do {                                                                                        \
    ncclResult_t r_ = (call);                                                                 \
    if (r_ != ncclSuccess) fatal_error(__FILE__, __LINE__, "NCCL: %s", ncclGetErrorString(r_)); \
  } while (0)

namespace comm_nccl {
namespace {

ncclComm_t handle(const Comm& c) {
  CHECK(c.nccl, "NCCL backend: axis %s has no NCCL communicator", axis_name(c.axis));
  return static_cast<ncclComm_t>(c.nccl);
}
// Queues an operation (`call`) on s under the watchdog (parallel/nccl_watchdog.h).
template <class Call>
void watched(Comm& c, const char* op, ops::Stream s, Call call) {
  const uint64_t ticket = nccl_watch_begin(c, op);
  call();
  nccl_watch_queued(c, ticket, s);
}
// The backend hands out its native stream through the seam; nullptr is the legacy default stream.
cudaStream_t cuda_stream(ops::Stream s) { return static_cast<cudaStream_t>(ops::native_stream(s)); }
ncclDataType_t nccl_type(DType dt) {
  switch (dt) {
    case DType::F32: return ncclFloat32;
    case DType::BF16: return ncclBfloat16;
    case DType::E4M3:
    case DType::E5M2: return ncclUint8;  // moved as bytes; a sum of FP8 is never asked for
    case DType::I8: return ncclInt8;     // compressed gradients: moved, never summed
    case DType::I32: return ncclInt32;
  }
  FATAL("NCCL backend: no NCCL type for dtype %d", (int)dt);
}

}  // namespace

void all_reduce_sum(Comm& c, void* buf, size_t count, DType dt, ops::Stream s) {
  watched(c, "all-reduce", s, [&] {
    NCCL_CHECK(ncclAllReduce(buf, buf, count, nccl_type(dt), ncclSum, handle(c), cuda_stream(s)));
  });
}

void all_reduce_max(Comm& c, float* buf, size_t count, ops::Stream s) {
  watched(c, "all-reduce (max)", s, [&] {
    NCCL_CHECK(ncclAllReduce(buf, buf, count, ncclFloat32, ncclMax, handle(c), cuda_stream(s)));
  });
}

void reduce_scatter_sum(Comm& c, const void* send, void* recv, size_t recv_count, DType dt,
                        ops::Stream s) {
  watched(c, "reduce-scatter", s, [&] {
    NCCL_CHECK(ncclReduceScatter(send, recv, recv_count, nccl_type(dt), ncclSum, handle(c),
                                 cuda_stream(s)));
  });
}

void all_gather(Comm& c, const void* send, void* recv, size_t send_count, DType dt,
                ops::Stream s) {
  watched(c, "all-gather", s, [&] {
    NCCL_CHECK(ncclAllGather(send, recv, send_count, nccl_type(dt), handle(c), cuda_stream(s)));
  });
}

void broadcast(Comm& c, void* buf, size_t count, DType dt, int root, ops::Stream s) {
  watched(c, "broadcast", s, [&] {
    NCCL_CHECK(ncclBroadcast(buf, buf, count, nccl_type(dt), root, handle(c), cuda_stream(s)));
  });
}

// Tag t > 0 travels on the group's communicator of that tag (comm_open_tags): NCCL matches
// point-to-point per communicator in posting order, so each tag is its own ordered stream.
void p2p_batch(Comm& c, const P2POp* ops, int n, DType dt, ops::Stream s) {
  const uint64_t ticket = nccl_watch_begin(c, "point-to-point");
  NCCL_CHECK(ncclGroupStart());
  for (int i = 0; i < n; i++) {
    const P2POp& op = ops[i];
    ncclComm_t comm =
        op.tag == 0 ? handle(c) : static_cast<ncclComm_t>(c.nccl_tags[op.tag - 1]);
    if (op.is_send)
      NCCL_CHECK(ncclSend(op.buf, op.count, nccl_type(dt), op.peer, comm, cuda_stream(s)));
    else
      NCCL_CHECK(ncclRecv(op.buf, op.count, nccl_type(dt), op.peer, comm, cuda_stream(s)));
  }
  NCCL_CHECK(ncclGroupEnd());
  nccl_watch_queued(c, ticket, s);
}

void all_to_all(Comm& c, const void* send, void* recv, size_t count, DType dt, ops::Stream s) {
  const size_t block = count * dtype_size(dt);
  const char* in = static_cast<const char*>(send);
  char* out = static_cast<char*>(recv);
  ncclComm_t comm = handle(c);
  const uint64_t ticket = nccl_watch_begin(c, "all-to-all");
  NCCL_CHECK(ncclGroupStart());
  for (int peer = 0; peer < c.size; ++peer) {
    NCCL_CHECK(ncclSend(in + peer * block, count, nccl_type(dt), peer, comm, cuda_stream(s)));
    NCCL_CHECK(ncclRecv(out + peer * block, count, nccl_type(dt), peer, comm, cuda_stream(s)));
  }
  NCCL_CHECK(ncclGroupEnd());
  nccl_watch_queued(c, ticket, s);
}

// Per peer one ncclSend and one ncclRecv of its block (offsets: the prefix sums of the counts),
// all in one group. A zero count posts nothing on that side; the two ranks of a pair skip alike,
// since what rank i sends to j is what j expects from i.
void all_to_all_v(Comm& c, const void* send, const size_t* send_counts, void* recv,
                  const size_t* recv_counts, DType dt, ops::Stream s) {
  const size_t elem = dtype_size(dt);
  const char* in = static_cast<const char*>(send);
  char* out = static_cast<char*>(recv);
  ncclComm_t comm = handle(c);
  size_t send_at = 0, recv_at = 0;  // elements
  const uint64_t ticket = nccl_watch_begin(c, "all-to-all-v");
  NCCL_CHECK(ncclGroupStart());
  for (int peer = 0; peer < c.size; ++peer) {
    if (send_counts[peer] > 0)
      NCCL_CHECK(ncclSend(in + send_at * elem, send_counts[peer], nccl_type(dt), peer, comm,
                          cuda_stream(s)));
    if (recv_counts[peer] > 0)
      NCCL_CHECK(ncclRecv(out + recv_at * elem, recv_counts[peer], nccl_type(dt), peer, comm,
                          cuda_stream(s)));
    send_at += send_counts[peer];
    recv_at += recv_counts[peer];
  }
  NCCL_CHECK(ncclGroupEnd());
  nccl_watch_queued(c, ticket, s);
}

}  // namespace comm_nccl

const CollectiveBackend kNcclCollectives = {
    comm_nccl::all_reduce_sum, comm_nccl::all_reduce_max, comm_nccl::reduce_scatter_sum,
    comm_nccl::all_gather,     comm_nccl::broadcast,      comm_nccl::p2p_batch,
    comm_nccl::all_to_all,     comm_nccl::all_to_all_v};

void nccl_require() {}  // this binary has NCCL

void* nccl_create(Comm& c) {
  ncclUniqueId id;
  if (c.rank == 0) NCCL_CHECK(ncclGetUniqueId(&id));
  mpi_host::broadcast(c, &id, sizeof(id), 0);
  ncclComm_t comm = nullptr;
  ncclResult_t r = ncclCommInitRank(&comm, c.size, id, c.rank);
  if (r != ncclSuccess)
    FATAL("NCCL: cannot create a communicator of %d ranks: %s (%s). NCCL needs one GPU per rank; "
          "when several ranks share a GPU use [parallel] backend = \"mpi\"",
          c.size, ncclGetErrorString(r), ncclGetLastError(nullptr));
  nccl_watch_register(c, comm);
  return comm;
}

void nccl_destroy(Comm& c, void* nccl_comm) {
  nccl_watch_unregister(c, nccl_comm);
  NCCL_CHECK(ncclCommDestroy(static_cast<ncclComm_t>(nccl_comm)));
}
