// parallel/comm.h - collectives over one axis of the device mesh. A Comm is a group: this
// rank's place in it (rank, size) and the backend's communicator. Backends:
//
//   NCCL : GPU buffers, GPU-side reductions, runs on the caller's stream. ./train's default.
//   MPI  : any buffers. With GPU buffers it stages through host memory (copy down, MPI on the
//          host, copy up), synchronously. ./train_cpu's only backend, and what several ranks
//          sharing one GPU must use (NCCL refuses two ranks on one device). Every process runs
//          MPI, also under NCCL: start-up, the groups and the host helpers below are MPI's.
//   Count: the planner's (training/plan.cu): every call is checked and counted exactly as a real
//          one and nothing moves; received buffers are left as they are, and the host helpers
//          answer as if every rank of the group were this one.
//   None : a description of a rank's place in a group, for laying out other ranks' shards (the
//          checkpoint index); any call on a group of two or more ranks is a bug.
//
// Every call is counted per axis: calls and payload bytes (the size of the buffer the caller
// hands in: for all-gather the gathered output, for reduce-scatter the full input, for
// a point-to-point send or receive the message, each op of a p2p_batch counted by itself). Ring
// algorithms put 2(n-1)/n of an all-reduce's payload and (n-1)/n of
// an all-gather's or reduce-scatter's on the wire per rank; the summary prints both.
//
// Point to point. p2p_batch posts a batch of sends and receives as one operation (NCCL: one
// group; MPI: Isend + Irecv + Waitall), so a pipeline stage can send its activation forward and
// receive a gradient backward in one call, whatever order its neighbours reach theirs. Its ops
// match in posting order per pair of ranks and tag (comm_open_tags), each tag one ordered stream
// (MPI: the tag; NCCL: a communicator per tag), so that a pipeline's activations and gradients
// need not arrive in one common order. (The tests' one- and two-message forms, send_to,
// recv_from and send_recv: test/comm_send_recv.h.)
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "kernels/ops.h"
#include "parallel/axis.h"
#include "parallel/watchdog.h"

enum class CommBackend : int { MPI = 0, NCCL, Count, None };

enum class CollectiveKind : int {
  AllReduce = 0, ReduceScatter, AllGather, Broadcast, Send, Recv, AllToAll, Barrier, Count
};

// Counters of one axis since the last comm_stats_reset().
struct CommCounters {
  uint64_t calls[(int)CollectiveKind::Count];
  uint64_t bytes[(int)CollectiveKind::Count];  // payload bytes, as defined above
};

struct CommStats {
  CommCounters axis[(int)Axis::Count];
  int group_size[(int)Axis::Count] = {};  // set by comm_create; the wire-byte factors need it
};

// A group over one mesh axis: this rank's place in it, and the backend's handles. Plain data,
// made by the mesh (parallel/mesh.h: mesh_init) and owned by it.
struct Comm {
  Axis axis = Axis::World;
  int rank = 0;                 // this rank's index within the group
  int size = 1;                 // group size
  CommBackend backend = CommBackend::None;
  CommStats* stats = nullptr;   // shared by all axes of the process (null: not counted)
  Watchdog* watch = nullptr;    // shared too: the deadline of waits (null: none)
  void* mpi = nullptr;          // the MPI backend's group (parallel/comm_mpi_runtime.cu)
  void* nccl = nullptr;         // ncclComm_t under the NCCL backend, in groups of 2 or more
  int tags = 1;                 // p2p tags 0 .. tags-1 (comm_open_tags)
  std::vector<void*> nccl_tags; // under NCCL, the ncclComm_t of tags 1 .. tags-1
  void* staging = nullptr;      // host buffer (malloc) for the MPI backend with GPU buffers
  size_t staging_bytes = 0;
};

// The groups of one rank by axis (parallel/mesh.h: mesh_comms), for the parameter store.
struct CommsByAxis {
  Comm* axis[(int)Axis::Count] = {};
  Comm* operator[](Axis a) const { return axis[(int)a]; }
};

// Sum over the group, in place. `count` elements of dtype dt.
void all_reduce_sum(Comm& c, void* buf, size_t count, DType dt, ops::Stream s);
// Elementwise maximum over the group, in place, fp32 (FP8 scaling agrees on amaxes with it).
void all_reduce_max(Comm& c, float* buf, size_t count, ops::Stream s);
// The input holds c.size * recv_count elements; rank r receives the sum of block r.
void reduce_scatter_sum(Comm& c, const void* send, void* recv, size_t recv_count, DType dt,
                        ops::Stream s);
// Each rank contributes send_count elements; recv (c.size * send_count) holds them in rank order.
void all_gather(Comm& c, const void* send, void* recv, size_t send_count, DType dt,
                ops::Stream s);
// The same for a few device floats of control, not counted (as the host helpers below): the
// ranks' parts of the step's loss and gradient norm, summed on the device so that the host never
// waits for them. Does nothing under Count (the planner's dry step has no values).
void all_gather_control(Comm& c, const float* send, float* recv, size_t send_count,
                        ops::Stream s);
void broadcast(Comm& c, void* buf, size_t count, DType dt, int root, ops::Stream s);
// A batch of point-to-point transfers, all posted before any is waited for (MPI: the receives,
// then the sends, then one Waitall; NCCL: one group), so that two ranks sending to each other do
// not wait for each other: a pipeline stage posts each run of messages between two computes so.
// Each op counts as a send or a recv; ops with count 0 post nothing (their peer is still
// checked); n = 0 is a no-op, also on a one-rank group. Under MPI the call returns when all are
// done; under NCCL all are queued on s.
struct P2POp {
  bool is_send = false;
  void* buf = nullptr;  // read for a send, written for a receive
  size_t count = 0;
  int peer = -1;
  int tag = 0;          // < c.tags: ops match per (pair of ranks, tag), in posting order
};
void p2p_batch(Comm& c, const P2POp* ops, int n, DType dt, ops::Stream s);
// Lets p2p_batch use tags 0 .. tags-1 on c (a no-op when c already has as many). Collective over
// the group (every member calls it, with the same count). MPI matches by tag natively; NCCL has
// no tags and matches point-to-point in order per communicator, so each tag gets one more
// communicator of the group; Count and None only record the count.
void comm_open_tags(Comm& c, int tags);
// send holds c.size blocks of count elements; block j goes to rank j; recv block j comes from j.
void all_to_all(Comm& c, const void* send, void* recv, size_t count, DType dt, ops::Stream s);
// The same with a size per peer (expert parallelism's dispatch and combine): send_counts[j]
// elements go to rank j and recv_counts[j] come from rank j (host arrays of c.size counts, any
// of them 0). The blocks lie back to back in rank order: block j starts at the prefix sum of the
// counts before j, in both buffers. recv_counts[j] must equal what rank j sends here (rank j's
// send_counts[c.rank]); send and recv must not overlap. Counted as an all-to-all of the send
// buffer's bytes (the sum of send_counts). One-rank group: a copy (the one count must match).
void all_to_all_v(Comm& c, const void* send, const size_t* send_counts, void* recv,
                  const size_t* recv_counts, DType dt, ops::Stream s);
void barrier(Comm& c);

// Small integer arrays on the host that steer the device work: the experts' token counts
// (parallel/expert_parallel.cu). Blocking MPI calls under both backends, counted like the
// others (4 bytes per int: all_to_all_host as its send buffer, c.size * per_peer ints).
void all_to_all_host(Comm& c, const int* send, int per_peer, int* recv);
void all_reduce_host_sum(Comm& c, int* x, int n);  // in place

// Host-side helpers on small host values (logging, agreeing on success, max of a scalar, the
// pipeline's timings, a rank's error message), not counted: they carry no payload of the model.
void all_reduce_host_sum(Comm& c, double* x, int n);  // in place
double all_reduce_host_sum(Comm& c, double x);
double all_reduce_host_max(Comm& c, double x);
bool all_agree(Comm& c, bool ok);  // true iff ok on every rank
void broadcast_host(Comm& c, void* buf, size_t bytes, int root);
// Every rank's `bytes` bytes, in rank order, into all (c.size * bytes).
void all_gather_host(Comm& c, const void* mine, size_t bytes, void* all);
// Every rank's string, in rank order (any lengths).
std::vector<std::string> all_gather_strings(Comm& c, const std::string& mine);

void comm_stats_reset(CommStats& st);  // zeroes the counters, keeps the group sizes
void comm_stats_add(CommStats& total, const CommStats& step);  // counters summed, sizes copied
// Prints one line per axis that was used: calls and bytes per step, and ring wire bytes.
void comm_stats_print(const CommStats& st, int steps, FILE* out);

// ---------------------------------------------------------------------------------------------
// The process and its groups (the MPI backend, parallel/comm_mpi_runtime.cu)
// ---------------------------------------------------------------------------------------------
// MPI_Init (thread level FUNNELED), world rank/size, local rank, the fatal-error handler that
// aborts every rank. Call first thing in main; a plain `./train config.toml` is one rank.
void runtime_init(int* argc, char*** argv, int* world_rank, int* world_size, int* local_rank);
void runtime_finalize();
// Makes c this rank's group of `axis`: the world ranks `members`, in group order, this rank among
// them. MPI and NCCL connect it: collective over the world (every rank makes the groups of the
// same axes in the same order), and under NCCL groups of 2+ also get an ncclComm (collective over
// the group; the device must be selected first). Count and None only describe it.
void comm_create(Comm& c, Axis axis, const std::vector<int>& members, int world_rank,
                 CommBackend backend, CommStats* stats, Watchdog* watch = nullptr);
void comm_destroy(Comm& c);  // frees the MPI and NCCL communicators and the staging buffer

// ---------------------------------------------------------------------------------------------
// The data-moving backends (used by parallel/comm*.cu only). They see groups of at least two
// ranks, already checked and counted.
// ---------------------------------------------------------------------------------------------
struct CollectiveBackend {
  void (*all_reduce_sum)(Comm& c, void* buf, size_t count, DType dt, ops::Stream s);
  void (*all_reduce_max)(Comm& c, float* buf, size_t count, ops::Stream s);
  void (*reduce_scatter_sum)(Comm& c, const void* send, void* recv, size_t recv_count, DType dt,
                             ops::Stream s);
  void (*all_gather)(Comm& c, const void* send, void* recv, size_t send_count, DType dt,
                     ops::Stream s);
  void (*broadcast)(Comm& c, void* buf, size_t count, DType dt, int root, ops::Stream s);
  // n >= 1 ops, each with a peer >= 0 and a count > 0.
  void (*p2p_batch)(Comm& c, const P2POp* ops, int n, DType dt, ops::Stream s);
  void (*all_to_all)(Comm& c, const void* send, void* recv, size_t count, DType dt, ops::Stream s);
  void (*all_to_all_v)(Comm& c, const void* send, const size_t* send_counts, void* recv,
                       const size_t* recv_counts, DType dt, ops::Stream s);
};
extern const CollectiveBackend kMpiCollectives;   // parallel/comm_mpi.cu
// parallel/comm_nccl.cu in ./train; parallel/comm_nccl_absent.cu (every call stops the job)
// in binaries built without NCCL.
extern const CollectiveBackend kNcclCollectives;
void nccl_require();             // stops the job with a clear message where NCCL is absent
void* nccl_create(Comm& c);      // an ncclComm_t for c's group (c.mpi is connected)
void nccl_destroy(Comm& c, void* nccl_comm);  // frees one made by nccl_create(c)

// The MPI backend's host side (parallel/comm_mpi_runtime.cu), for the host helpers above under
// every backend: small host arrays of ints, doubles or bytes.
enum class HostType { Int, Double, Byte };
enum class HostOp { Sum, Max, And };
namespace mpi_host {
void barrier(Comm& c);
void all_reduce(Comm& c, void* x, int n, HostType t, HostOp op);  // in place
void all_to_all(Comm& c, const void* send, int per_peer, void* recv, HostType t);
void broadcast(Comm& c, void* buf, size_t bytes, int root);
void all_gather(Comm& c, const void* mine, size_t bytes, void* all);
void all_gather_v(Comm& c, const void* mine, int bytes, const int* all_bytes, void* all);
}  // namespace mpi_host
