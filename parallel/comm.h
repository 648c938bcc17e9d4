// parallel/comm.h - collectives over one axis of the device mesh, with two backends.
//
//   NCCL: GPU buffers, GPU-side reductions, runs on the caller's stream. ./train's default.
//   MPI : any buffers. With GPU buffers it stages through host memory (copy down, MPI on the
//         host, copy up), synchronously. ./train_cpu's only backend, and what several ranks
//         sharing one GPU must use (NCCL refuses two ranks on one device).
//
// Every call is counted per axis: calls and payload bytes (the size of the buffer the caller
// hands in: for all-gather the gathered output, for reduce-scatter the full input, for
// send/recv the message; a paired send_recv counts its send side as a send and its receive side as
// a recv). Ring algorithms put 2(n-1)/n of an all-reduce's payload and (n-1)/n of
// an all-gather's or reduce-scatter's on the wire per rank; the summary prints both.
//
// Point to point. send_to and recv_from are blocking on the MPI backend: two ranks that both
// send a large message to each other first wait for each other forever. send_recv posts a send
// and a receive as one operation (NCCL: one group; MPI: Isend + Irecv + Waitall), so a pipeline
// stage can send its activation forward and receive a gradient backward in one call, whatever
// order its neighbours reach theirs. All three match each other in posting order per pair of
// ranks (MPI tag 0; NCCL orders point-to-point per peer): a send_recv's send may be received by
// a recv_from, and so on.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <cstdio>

#include "kernels/ops.h"

// Stage: the ranks of one pipeline stage (every axis but pp); Embed: the first and the last
// pipeline stage of one pipeline (the tied embedding's two copies).
enum class Axis : int { World = 0, DP, TP, PP, CP, EP, DPCP, EPDP, Stage, Embed, Count };
// "world", "dp", "tp", "pp", "cp", "ep", "dp*cp", "ep-dp", "stage", "embed"
const char* axis_name(Axis a);

enum class CommBackend : int { MPI = 0, NCCL = 1 };

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

// A communicator over one mesh axis. Plain data; created by the mesh (parallel/mesh.h).
struct Comm {
  Axis axis = Axis::World;
  int rank = 0;                 // this rank's index within the group
  int size = 1;                 // group size
  CommBackend backend = CommBackend::MPI;
  MPI_Comm mpi = MPI_COMM_NULL;
  void* nccl = nullptr;         // ncclComm_t under the NCCL backend
  CommStats* stats = nullptr;   // shared by all axes of the process
  void* staging = nullptr;      // host buffer (malloc) for the MPI backend with GPU buffers
  size_t staging_bytes = 0;
};

// The communicators of the mesh by axis (parallel/mesh.h: mesh_comms).
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
void broadcast(Comm& c, void* buf, size_t count, DType dt, int root, ops::Stream s);
void send_to(Comm& c, const void* buf, size_t count, DType dt, int peer, ops::Stream s);
void recv_from(Comm& c, void* buf, size_t count, DType dt, int peer, ops::Stream s);
// Sends send_count elements to send_peer and receives recv_count elements from recv_peer, both
// posted before either is waited for. The two peers may be one rank or two different ones (never
// this rank). A side
// whose peer is -1 is absent (its buffer and count are ignored), and a side with count 0 posts
// nothing (its peer is still checked): the matching rank must then skip its side too. Both sides
// absent: a no-op, also on a one-rank group. Under MPI the call returns when both are complete;
// under NCCL both are queued on s. send and recv must not overlap.
void send_recv(Comm& c, const void* send, size_t send_count, int send_peer, void* recv,
               size_t recv_count, int recv_peer, DType dt, ops::Stream s);
// A batch of point-to-point transfers, all posted before any is waited for (MPI: the receives,
// then the sends, then one Waitall; NCCL: one group): the general form of send_recv, for a
// pipeline stage whose schedule puts several messages between two computes. Each op counts as
// a send or a recv; ops with count 0 post nothing. Under MPI the call returns when all are done.
struct P2POp {
  bool is_send = false;
  void* buf = nullptr;  // read for a send, written for a receive
  size_t count = 0;
  int peer = -1;
};
void p2p_batch(Comm& c, const P2POp* ops, int n, DType dt, ops::Stream s);
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

// Host-side helpers on small host values (logging, agreeing on success, max of a scalar),
// not counted: they carry no payload of the model.
void all_reduce_host_sum(Comm& c, double* x, int n);  // in place
double all_reduce_host_sum(Comm& c, double x);
double all_reduce_host_max(Comm& c, double x);
bool all_agree(Comm& c, bool ok);  // true iff ok on every rank

void comm_stats_reset(CommStats& st);  // zeroes the counters, keeps the group sizes
void comm_stats_add(CommStats& total, const CommStats& step);  // counters summed, sizes copied
// Prints one line per axis that was used: calls and bytes per step, and ring wire bytes.
void comm_stats_print(const CommStats& st, int steps, FILE* out);

// ---------------------------------------------------------------------------------------------
// Construction and the two backends. Used by parallel/mesh.cu and parallel/comm.cu only.
// ---------------------------------------------------------------------------------------------
// Makes c a communicator over `group` (an MPI communicator this rank belongs to; c owns it from
// now on). Under NCCL, groups of more than one rank also get an ncclComm (collective over group).
void comm_create(Comm& c, Axis axis, MPI_Comm group, CommBackend backend, CommStats* stats);
void comm_destroy(Comm& c);  // frees the MPI and NCCL communicators and the staging buffer

// The backends see groups of at least two ranks, already counted and checked.
namespace comm_mpi {
void all_reduce_max(Comm& c, float* buf, size_t count, ops::Stream s);  // parallel/comm_mpi.cu
void all_reduce_sum(Comm& c, void* buf, size_t count, DType dt, ops::Stream s);
void reduce_scatter_sum(Comm& c, const void* send, void* recv, size_t recv_count, DType dt,
                        ops::Stream s);
void all_gather(Comm& c, const void* send, void* recv, size_t send_count, DType dt,
                ops::Stream s);
void broadcast(Comm& c, void* buf, size_t count, DType dt, int root, ops::Stream s);
void send_to(Comm& c, const void* buf, size_t count, DType dt, int peer, ops::Stream s);
void recv_from(Comm& c, void* buf, size_t count, DType dt, int peer, ops::Stream s);
// n >= 1 ops, each with a peer >= 0 and a count > 0.
void p2p_batch(Comm& c, const P2POp* ops, int n, DType dt, ops::Stream s);
void all_to_all(Comm& c, const void* send, void* recv, size_t count, DType dt, ops::Stream s);
void all_to_all_v(Comm& c, const void* send, const size_t* send_counts, void* recv,
                  const size_t* recv_counts, DType dt, ops::Stream s);
}  // namespace comm_mpi

namespace comm_nccl {
void all_reduce_max(Comm& c, float* buf, size_t count, ops::Stream s);  // parallel/comm_nccl.cu in ./train, parallel/comm_nccl_absent.cu elsewhere
void require();  // stops the job with a clear message in a binary built without NCCL
void* create(MPI_Comm group, int group_rank, int group_size);  // an ncclComm_t
void destroy(void* nccl);
void all_reduce_sum(Comm& c, void* buf, size_t count, DType dt, ops::Stream s);
void reduce_scatter_sum(Comm& c, const void* send, void* recv, size_t recv_count, DType dt,
                        ops::Stream s);
void all_gather(Comm& c, const void* send, void* recv, size_t send_count, DType dt,
                ops::Stream s);
void broadcast(Comm& c, void* buf, size_t count, DType dt, int root, ops::Stream s);
void send_to(Comm& c, const void* buf, size_t count, DType dt, int peer, ops::Stream s);
void recv_from(Comm& c, void* buf, size_t count, DType dt, int peer, ops::Stream s);
// n >= 1 ops, each with a peer >= 0 and a count > 0.
void p2p_batch(Comm& c, const P2POp* ops, int n, DType dt, ops::Stream s);
void all_to_all(Comm& c, const void* send, void* recv, size_t count, DType dt, ops::Stream s);
void all_to_all_v(Comm& c, const void* send, const size_t* send_counts, void* recv,
                  const size_t* recv_counts, DType dt, ops::Stream s);
}  // namespace comm_nccl
