// parallel/comm.cu - the front of the communicator: every collective is checked, counted on its
// axis and handed to the MPI backend (parallel/comm_mpi.cu) or the NCCL backend
// (parallel/comm_nccl.cu) according to Comm::backend. Also the per-step summary of the counters
// and the host-side helpers.
//
// Choices worth knowing:
// - A group of one rank short-circuits before any backend and is NOT counted: it moves no bytes
//   (all-reduce and broadcast leave the buffer as it is; reduce-scatter, all-gather, all-to-all
//   and all-to-all-v copy their input to their output unless both are the same buffer). So a
//   one-rank run reports no communication at all, and a dp x tp run counts nothing on its size-1
//   axes.
// - Payload bytes are the size of the buffer the caller hands in (see comm.h): the gathered
//   output of an all-gather, the full input of a reduce-scatter, the send buffer of an
//   all-to-all (all-to-all-v: the sum of its send counts), the message of a send or a recv (both
//   sides count it), 0 for a barrier. A send_recv counts as a send (its send side) plus a recv
//   (its receive side); an absent side counts nothing.
// - all_reduce_host_sum/max and all_agree are control plane (a few bytes for logging and for
//   agreeing on success); they go straight to MPI on the group's communicator and are not
//   counted, so the counters describe only the training data plane.
#include <cstdlib>
#include <cstring>
#include <vector>

#include "parallel/comm.h"

const char* axis_name(Axis a) {
  switch (a) {
    case Axis::World: return "world";
    case Axis::DP: return "dp";
    case Axis::TP: return "tp";
    case Axis::PP: return "pp";
    case Axis::CP: return "cp";
    case Axis::EP: return "ep";
    case Axis::DPCP: return "dp*cp";
    case Axis::EPDP: return "ep-dp";
    case Axis::Stage: return "stage";
    case Axis::Embed: return "embed";
    default: return "?";
  }
}

static const char* kind_name(CollectiveKind k) {
  static const char* names[] = {"all-reduce", "reduce-scatter", "all-gather", "broadcast",
                                "send",       "recv",           "all-to-all", "barrier"};
  return names[(int)k];
}

// ---------------------------------------------------------------------------------------------
// Construction
// ---------------------------------------------------------------------------------------------
void comm_create(Comm& c, Axis axis, MPI_Comm group, CommBackend backend, CommStats* stats) {
  c = Comm{};
  c.axis = axis;
  c.mpi = group;
  c.backend = backend;
  c.stats = stats;
  MPI_Comm_rank(group, &c.rank);
  MPI_Comm_size(group, &c.size);
  if (stats) stats->group_size[(int)axis] = c.size;
  // One-rank groups never reach a backend, so they need no NCCL communicator.
  if (backend == CommBackend::NCCL && c.size > 1) c.nccl = comm_nccl::create(group, c.rank, c.size);
}

void comm_destroy(Comm& c) {
  if (c.nccl) comm_nccl::destroy(c.nccl);
  if (c.mpi != MPI_COMM_NULL) MPI_Comm_free(&c.mpi);
  std::free(c.staging);
  c = Comm{};
}

// ---------------------------------------------------------------------------------------------
// Counting and checks
// ---------------------------------------------------------------------------------------------
static void tally(Comm& c, CollectiveKind kind, size_t bytes) {
  if (!c.stats) return;
  CommCounters& k = c.stats->axis[(int)c.axis];
  k.calls[(int)kind] += 1;
  k.bytes[(int)kind] += bytes;
}

static void check_peer(const Comm& c, int peer, const char* what) {
  CHECK(peer >= 0 && peer < c.size && peer != c.rank,
        "%s on axis %s: peer %d is not another rank of the group (rank %d of %d)", what,
        axis_name(c.axis), peer, c.rank, c.size);
}

// The one-rank case of the collectives whose output is a copy of the input.
static void copy_if_distinct(void* dst, const void* src, size_t bytes, ops::Stream s) {
  if (dst != src && bytes > 0) ops::copy_on_device(dst, src, bytes, s);
}

// ---------------------------------------------------------------------------------------------
// The collectives
// ---------------------------------------------------------------------------------------------
void all_reduce_sum(Comm& c, void* buf, size_t count, DType dt, ops::Stream s) {
  if (c.size == 1) return;
  tally(c, CollectiveKind::AllReduce, count * dtype_size(dt));
  if (c.backend == CommBackend::NCCL) comm_nccl::all_reduce_sum(c, buf, count, dt, s);
  else comm_mpi::all_reduce_sum(c, buf, count, dt, s);
}

void all_reduce_max(Comm& c, float* buf, size_t count, ops::Stream s) {
  if (c.size == 1) return;
  tally(c, CollectiveKind::AllReduce, count * sizeof(float));
  if (c.backend == CommBackend::NCCL) comm_nccl::all_reduce_max(c, buf, count, s);
  else comm_mpi::all_reduce_max(c, buf, count, s);
}

void reduce_scatter_sum(Comm& c, const void* send, void* recv, size_t recv_count, DType dt,
                        ops::Stream s) {
  if (c.size == 1) return copy_if_distinct(recv, send, recv_count * dtype_size(dt), s);
  tally(c, CollectiveKind::ReduceScatter, c.size * recv_count * dtype_size(dt));
  if (c.backend == CommBackend::NCCL)
    comm_nccl::reduce_scatter_sum(c, send, recv, recv_count, dt, s);
  else
    comm_mpi::reduce_scatter_sum(c, send, recv, recv_count, dt, s);
}

void all_gather(Comm& c, const void* send, void* recv, size_t send_count, DType dt,
                ops::Stream s) {
  if (c.size == 1) return copy_if_distinct(recv, send, send_count * dtype_size(dt), s);
  tally(c, CollectiveKind::AllGather, c.size * send_count * dtype_size(dt));
  if (c.backend == CommBackend::NCCL) comm_nccl::all_gather(c, send, recv, send_count, dt, s);
  else comm_mpi::all_gather(c, send, recv, send_count, dt, s);
}

void broadcast(Comm& c, void* buf, size_t count, DType dt, int root, ops::Stream s) {
  CHECK(root >= 0 && root < c.size, "broadcast on axis %s: root %d outside the group of %d",
        axis_name(c.axis), root, c.size);
  if (c.size == 1) return;
  tally(c, CollectiveKind::Broadcast, count * dtype_size(dt));
  if (c.backend == CommBackend::NCCL) comm_nccl::broadcast(c, buf, count, dt, root, s);
  else comm_mpi::broadcast(c, buf, count, dt, root, s);
}

void send_to(Comm& c, const void* buf, size_t count, DType dt, int peer, ops::Stream s) {
  check_peer(c, peer, "send");
  tally(c, CollectiveKind::Send, count * dtype_size(dt));
  if (c.backend == CommBackend::NCCL) comm_nccl::send_to(c, buf, count, dt, peer, s);
  else comm_mpi::send_to(c, buf, count, dt, peer, s);
}

void recv_from(Comm& c, void* buf, size_t count, DType dt, int peer, ops::Stream s) {
  check_peer(c, peer, "recv");
  tally(c, CollectiveKind::Recv, count * dtype_size(dt));
  if (c.backend == CommBackend::NCCL) comm_nccl::recv_from(c, buf, count, dt, peer, s);
  else comm_mpi::recv_from(c, buf, count, dt, peer, s);
}

// A side is absent when its peer is -1 or its count is 0 (the peer is then still checked); the
// backends see absent sides as peer -1 and at least one present side.
void send_recv(Comm& c, const void* send, size_t send_count, int send_peer, void* recv,
               size_t recv_count, int recv_peer, DType dt, ops::Stream s) {
  if (send_peer != -1) check_peer(c, send_peer, "send_recv (send side)");
  if (recv_peer != -1) check_peer(c, recv_peer, "send_recv (receive side)");
  P2POp ops[2];
  int n = 0;
  if (send_peer != -1) ops[n++] = {true, const_cast<void*>(send), send_count, send_peer};
  if (recv_peer != -1) ops[n++] = {false, recv, recv_count, recv_peer};
  p2p_batch(c, ops, n, dt, s);
}

void p2p_batch(Comm& c, const P2POp* ops, int n, DType dt, ops::Stream s) {
  std::vector<P2POp> posted;
  for (int i = 0; i < n; i++) {
    check_peer(c, ops[i].peer, ops[i].is_send ? "p2p send" : "p2p receive");
    if (ops[i].count == 0) continue;
    tally(c, ops[i].is_send ? CollectiveKind::Send : CollectiveKind::Recv,
          ops[i].count * dtype_size(dt));
    posted.push_back(ops[i]);
  }
  if (posted.empty()) return;
  const int m = (int)posted.size();
  if (c.backend == CommBackend::NCCL) comm_nccl::p2p_batch(c, posted.data(), m, dt, s);
  else comm_mpi::p2p_batch(c, posted.data(), m, dt, s);
}

void all_to_all(Comm& c, const void* send, void* recv, size_t count, DType dt, ops::Stream s) {
  if (c.size == 1) return copy_if_distinct(recv, send, count * dtype_size(dt), s);
  tally(c, CollectiveKind::AllToAll, c.size * count * dtype_size(dt));
  if (c.backend == CommBackend::NCCL) comm_nccl::all_to_all(c, send, recv, count, dt, s);
  else comm_mpi::all_to_all(c, send, recv, count, dt, s);
}

static size_t sum_counts(const size_t* counts, int n) {
  size_t total = 0;
  for (int j = 0; j < n; j++) total += counts[j];
  return total;
}

void all_to_all_v(Comm& c, const void* send, const size_t* send_counts, void* recv,
                  const size_t* recv_counts, DType dt, ops::Stream s) {
  if (c.size == 1) {
    CHECK(send_counts[0] == recv_counts[0],
          "all_to_all_v on axis %s (one rank): sends %zu elements to itself but expects %zu",
          axis_name(c.axis), send_counts[0], recv_counts[0]);
    return copy_if_distinct(recv, send, send_counts[0] * dtype_size(dt), s);
  }
  tally(c, CollectiveKind::AllToAll, sum_counts(send_counts, c.size) * dtype_size(dt));
  if (c.backend == CommBackend::NCCL)
    comm_nccl::all_to_all_v(c, send, send_counts, recv, recv_counts, dt, s);
  else
    comm_mpi::all_to_all_v(c, send, send_counts, recv, recv_counts, dt, s);
}

// A host barrier under both backends: it orders the ranks' host code, it does not wait for
// work already queued on streams.
void barrier(Comm& c) {
  if (c.size == 1) return;
  tally(c, CollectiveKind::Barrier, 0);
  MPI_Barrier(c.mpi);
}

void all_to_all_host(Comm& c, const int* send, int per_peer, int* recv) {
  if (c.size == 1) {
    std::memcpy(recv, send, (size_t)per_peer * sizeof(int));
    return;
  }
  tally(c, CollectiveKind::AllToAll, (size_t)c.size * per_peer * sizeof(int));
  MPI_Alltoall(send, per_peer, MPI_INT, recv, per_peer, MPI_INT, c.mpi);
}

void all_reduce_host_sum(Comm& c, int* x, int n) {
  if (c.size == 1) return;
  tally(c, CollectiveKind::AllReduce, (size_t)n * sizeof(int));
  MPI_Allreduce(MPI_IN_PLACE, x, n, MPI_INT, MPI_SUM, c.mpi);
}

// ---------------------------------------------------------------------------------------------
// Host helpers (control plane, not counted)
// ---------------------------------------------------------------------------------------------
void all_reduce_host_sum(Comm& c, double* x, int n) {
  if (c.size > 1) MPI_Allreduce(MPI_IN_PLACE, x, n, MPI_DOUBLE, MPI_SUM, c.mpi);
}
static double host_reduce(Comm& c, double x, MPI_Op op) {
  if (c.size == 1) return x;
  double r = 0;
  MPI_Allreduce(&x, &r, 1, MPI_DOUBLE, op, c.mpi);
  return r;
}
double all_reduce_host_sum(Comm& c, double x) { return host_reduce(c, x, MPI_SUM); }
double all_reduce_host_max(Comm& c, double x) { return host_reduce(c, x, MPI_MAX); }

bool all_agree(Comm& c, bool ok) {
  if (c.size == 1) return ok;
  int mine = ok ? 1 : 0, all = 0;
  MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_LAND, c.mpi);
  return all != 0;
}

// ---------------------------------------------------------------------------------------------
// Summary
// ---------------------------------------------------------------------------------------------
void comm_stats_reset(CommStats& st) {
  for (CommCounters& k : st.axis) {
    std::memset(k.calls, 0, sizeof(k.calls));
    std::memset(k.bytes, 0, sizeof(k.bytes));
  }
}

// Bytes a ring algorithm sends per rank, as a multiple of the payload, in a group of n ranks: a
// ring all-reduce is a reduce-scatter then an all-gather, each sending (n-1)/n of the payload
// per rank, so 2(n-1)/n in all (NCCL's "bus bandwidth" factors:
// https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md). A broadcast is
// pipelined along the ring: every rank but the last forwards the whole message once.
static double wire_factor(CollectiveKind kind, int n) {
  switch (kind) {
    case CollectiveKind::AllReduce: return 2.0 * (n - 1) / n;
    case CollectiveKind::ReduceScatter:
    case CollectiveKind::AllGather:
    case CollectiveKind::AllToAll: return double(n - 1) / n;
    case CollectiveKind::Broadcast:
    case CollectiveKind::Send:
    case CollectiveKind::Recv: return 1.0;
    default: return 0.0;
  }
}

// One line per used axis, e.g.
//   comm dp (n=4): all-reduce 12 calls/step 497.42 MB/step (wire 746.13 MB/rank); barrier ...
// MB = 1e6 bytes. "wire" is what the ring algorithm sends per rank per step (for a recv: what
// the rank receives).
void comm_stats_add(CommStats& total, const CommStats& step) {
  for (int a = 0; a < (int)Axis::Count; a++) {
    total.group_size[a] = step.group_size[a];
    for (int k = 0; k < (int)CollectiveKind::Count; k++) {
      total.axis[a].calls[k] += step.axis[a].calls[k];
      total.axis[a].bytes[k] += step.axis[a].bytes[k];
    }
  }
}

void comm_stats_print(const CommStats& st, int steps, FILE* out) {
  const double per_step = 1.0 / (steps > 0 ? steps : 1);
  for (int a = 0; a < (int)Axis::Count; ++a) {
    const CommCounters& k = st.axis[a];
    bool used = false;
    for (int j = 0; j < (int)CollectiveKind::Count; ++j) used = used || k.calls[j] > 0;
    if (!used) continue;
    const int n = st.group_size[a];
    std::fprintf(out, "comm %s (n=%d):", axis_name((Axis)a), n);
    const char* sep = " ";
    for (int j = 0; j < (int)CollectiveKind::Count; ++j) {
      if (k.calls[j] == 0) continue;
      const CollectiveKind kind = (CollectiveKind)j;
      const double mb = k.bytes[j] * per_step / 1e6;
      std::fprintf(out, "%s%s %.4g calls/step", sep, kind_name(kind), k.calls[j] * per_step);
      if (kind != CollectiveKind::Barrier)
        std::fprintf(out, " %.2f MB/step (wire %.2f MB/rank)", mb, mb * wire_factor(kind, n));
      sep = "; ";
    }
    std::fprintf(out, "\n");
  }
}
