// parallel/comm.cu - the front of the communicator: every collective is checked, counted on its
// axis and handed to the MPI backend (parallel/comm_mpi.cu) or the NCCL backend
// (parallel/comm_nccl.cu) according to Comm::backend, or to nobody under Count (the planner).
// Also the host-side helpers (MPI's host side under every backend: parallel/comm_mpi_runtime.cu)
// and the per-step summary of the counters.
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
//   sides count it: each op of a p2p_batch by itself, one with count 0 not at all), 0 for a
//   barrier.
// - all_reduce_host_sum/max, all_agree and the other uncounted host helpers are control plane (a
//   few bytes for logging and for agreeing on success); they go to MPI on the group and are not
//   counted, so the counters describe only the training data plane. So is all_gather_control, on
//   the device: a float or two per rank (the step's loss and gradient-norm parts).
// - Count moves nothing but counts everything a real backend would; its host helpers answer as if
//   every rank of the group were this one (a sum is size times this rank's value, an all-to-all
//   hands back this rank's own block from everyone), which is what the planner's balanced,
//   identical ranks would see.
// - Tracing ([log] trace, kernels/trace.h): every counted call is a span on the trace's comm
//   lane, named by its kind, with its axis, group size and the bytes it counts (a p2p batch: one
//   span listing each message's direction, peer and bytes), so a trace and the accounting agree.
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernels/trace.h"
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
    case Axis::Island: return "island";
    case Axis::IslandWorld: return "island-world";
    case Axis::CPA2A: return "cp-a2a";
    case Axis::CPRing: return "cp-ring";
    case Axis::DPShard: return "dp-shard";
    case Axis::DPReplica: return "dp-replica";
    case Axis::DPCPShard: return "dp*cp-shard";
    case Axis::DPCPReplica: return "dp*cp-replica";
    case Axis::EPDPShard: return "ep-dp-shard";
    case Axis::EPDPReplica: return "ep-dp-replica";
    default: return "?";
  }
}

static const char* kind_name(CollectiveKind k) {
  static const char* names[] = {"all-reduce", "reduce-scatter", "all-gather", "broadcast",
                                "send",       "recv",           "all-to-all", "barrier"};
  return names[(int)k];
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

// Counts a call on group c (the comm accounting) and opens its trace span with the same bytes
// (inactive outside traced steps) on `stream` (null: the host clock), so the two always agree.
#define COUNT_CALL(kind, bytes, stream)                                  \
  const size_t counted_bytes = (bytes);                                  \
  tally(c, kind, counted_bytes);                                         \
  trace::Span span(trace::Lane::Comm, "comm", kind_name(kind), stream);  \
  span_args(span, c, counted_bytes)

static void span_args(trace::Span& span, const Comm& c, size_t bytes) {
  if (!span.active()) return;
  span.arg("axis", axis_name(c.axis));
  span.arg("group", (long long)c.size);
  span.arg("bytes", (long long)bytes);
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

// Whether a call on a group of 2+ ranks reaches a backend: not under Count (the planner counts
// only); a group that only describes a rank (None) must never be used.
static bool moves_data(const Comm& c) {
  if (c.backend == CommBackend::None)
    BUG("axis %s describes rank %d of a group of %d and cannot communicate", axis_name(c.axis),
        c.rank, c.size);
  return c.backend != CommBackend::Count;
}

static const CollectiveBackend& backend_of(const Comm& c) {
  return c.backend == CommBackend::NCCL ? kNcclCollectives : kMpiCollectives;
}

// ---------------------------------------------------------------------------------------------
// The collectives
// ---------------------------------------------------------------------------------------------
void all_reduce_sum(Comm& c, void* buf, size_t count, DType dt, ops::Stream s) {
  if (c.size == 1) return;
  COUNT_CALL(CollectiveKind::AllReduce, count * dtype_size(dt), s);
  if (moves_data(c)) backend_of(c).all_reduce_sum(c, buf, count, dt, s);
}

void all_reduce_max(Comm& c, float* buf, size_t count, ops::Stream s) {
  if (c.size == 1) return;
  COUNT_CALL(CollectiveKind::AllReduce, count * sizeof(float), s);
  if (moves_data(c)) backend_of(c).all_reduce_max(c, buf, count, s);
}

void reduce_scatter_sum(Comm& c, const void* send, void* recv, size_t recv_count, DType dt,
                        ops::Stream s) {
  if (c.size == 1) return copy_if_distinct(recv, send, recv_count * dtype_size(dt), s);
  COUNT_CALL(CollectiveKind::ReduceScatter, c.size * recv_count * dtype_size(dt), s);
  if (moves_data(c)) backend_of(c).reduce_scatter_sum(c, send, recv, recv_count, dt, s);
}

void all_gather(Comm& c, const void* send, void* recv, size_t send_count, DType dt,
                ops::Stream s) {
  if (c.size == 1) return copy_if_distinct(recv, send, send_count * dtype_size(dt), s);
  COUNT_CALL(CollectiveKind::AllGather, c.size * send_count * dtype_size(dt), s);
  if (moves_data(c)) backend_of(c).all_gather(c, send, recv, send_count, dt, s);
}

void all_gather_control(Comm& c, const float* send, float* recv, size_t send_count,
                        ops::Stream s) {
  if (c.size == 1) return copy_if_distinct(recv, send, send_count * sizeof(float), s);
  if (moves_data(c)) backend_of(c).all_gather(c, send, recv, send_count, DType::F32, s);
}

void broadcast(Comm& c, void* buf, size_t count, DType dt, int root, ops::Stream s) {
  CHECK(root >= 0 && root < c.size, "broadcast on axis %s: root %d outside the group of %d",
        axis_name(c.axis), root, c.size);
  if (c.size == 1) return;
  COUNT_CALL(CollectiveKind::Broadcast, count * dtype_size(dt), s);
  if (moves_data(c)) backend_of(c).broadcast(c, buf, count, dt, root, s);
}

void p2p_batch(Comm& c, const P2POp* ops, int n, DType dt, ops::Stream s) {
  std::vector<P2POp> posted;
  for (int i = 0; i < n; i++) {
    check_peer(c, ops[i].peer, ops[i].is_send ? "p2p send" : "p2p receive");
    CHECK(ops[i].tag >= 0 && ops[i].tag < c.tags, "p2p on axis %s: tag %d, the group has tags "
          "0..%d (comm_open_tags)", axis_name(c.axis), ops[i].tag, c.tags - 1);
    if (ops[i].count == 0) continue;
    tally(c, ops[i].is_send ? CollectiveKind::Send : CollectiveKind::Recv,
          ops[i].count * dtype_size(dt));
    posted.push_back(ops[i]);
  }
  if (posted.empty()) return;
  trace::Span span(trace::Lane::Comm, "comm", "p2p", s);
  if (span.active()) {
    std::string list = "[";
    for (const P2POp& op : posted)
      list += (list.size() > 1 ? "," : "") + std::string("{\"op\":\"") +
              (op.is_send ? "send" : "recv") + "\",\"peer\":" + std::to_string(op.peer) +
              ",\"bytes\":" + std::to_string(op.count * dtype_size(dt)) + "}";
    span.arg("axis", axis_name(c.axis));
    span.arg_list("messages", list + "]");
  }
  if (moves_data(c)) backend_of(c).p2p_batch(c, posted.data(), (int)posted.size(), dt, s);
}

void all_to_all(Comm& c, const void* send, void* recv, size_t count, DType dt, ops::Stream s) {
  if (c.size == 1) return copy_if_distinct(recv, send, count * dtype_size(dt), s);
  COUNT_CALL(CollectiveKind::AllToAll, c.size * count * dtype_size(dt), s);
  if (moves_data(c)) backend_of(c).all_to_all(c, send, recv, count, dt, s);
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
  COUNT_CALL(CollectiveKind::AllToAll, sum_counts(send_counts, c.size) * dtype_size(dt), s);
  if (moves_data(c)) backend_of(c).all_to_all_v(c, send, send_counts, recv, recv_counts, dt, s);
}

// ---------------------------------------------------------------------------------------------
// On the host (MPI under every backend)
// ---------------------------------------------------------------------------------------------
// A host barrier: it orders the ranks' host code, it does not wait for work queued on streams.
void barrier(Comm& c) {
  if (c.size == 1) return;
  COUNT_CALL(CollectiveKind::Barrier, 0, nullptr);  // a host barrier: the host clock
  if (moves_data(c)) mpi_host::barrier(c);
}

void all_to_all_host(Comm& c, const int* send, int per_peer, int* recv) {
  if (c.size > 1) {
    COUNT_CALL(CollectiveKind::AllToAll, (size_t)c.size * per_peer * sizeof(int), nullptr);
    if (moves_data(c)) return mpi_host::all_to_all(c, send, per_peer, recv, HostType::Int);
  }
  for (int j = 0; j < c.size; j++)  // every rank (here: this one) sends this rank its block
    std::memcpy(recv + (size_t)j * per_peer, send + (size_t)c.rank * per_peer,
                (size_t)per_peer * sizeof(int));
}

void all_reduce_host_sum(Comm& c, int* x, int n) {
  if (c.size == 1) return;
  COUNT_CALL(CollectiveKind::AllReduce, (size_t)n * sizeof(int), nullptr);  // the host clock
  if (moves_data(c)) return mpi_host::all_reduce(c, x, n, HostType::Int, HostOp::Sum);
  for (int i = 0; i < n; i++) x[i] *= c.size;
}

// The uncounted helpers. A one-rank group, and the planner's Count groups, answer alone.
static bool alone(const Comm& c) { return c.size == 1 || !moves_data(c); }

void all_reduce_host_sum(Comm& c, double* x, int n) {
  if (!alone(c)) return mpi_host::all_reduce(c, x, n, HostType::Double, HostOp::Sum);
  for (int i = 0; i < n; i++) x[i] *= c.size;
}
double all_reduce_host_sum(Comm& c, double x) {
  all_reduce_host_sum(c, &x, 1);
  return x;
}
double all_reduce_host_max(Comm& c, double x) {
  if (!alone(c)) mpi_host::all_reduce(c, &x, 1, HostType::Double, HostOp::Max);
  return x;
}
bool all_agree(Comm& c, bool ok) {
  int mine = ok ? 1 : 0;
  if (!alone(c)) mpi_host::all_reduce(c, &mine, 1, HostType::Int, HostOp::And);
  return mine != 0;
}
void broadcast_host(Comm& c, void* buf, size_t bytes, int root) {
  CHECK(root >= 0 && root < c.size, "broadcast_host on axis %s: root %d outside the group of %d",
        axis_name(c.axis), root, c.size);
  if (!alone(c)) mpi_host::broadcast(c, buf, bytes, root);
}
void all_gather_host(Comm& c, const void* mine, size_t bytes, void* all) {
  if (!alone(c)) return mpi_host::all_gather(c, mine, bytes, all);
  for (int r = 0; r < c.size; r++) std::memmove((char*)all + r * bytes, mine, bytes);
}
std::vector<std::string> all_gather_strings(Comm& c, const std::string& mine) {
  if (alone(c)) return std::vector<std::string>(c.size, mine);
  std::vector<int> lens(c.size);
  const int len = (int)mine.size();
  mpi_host::all_gather(c, &len, sizeof(int), lens.data());
  std::vector<std::string> all(c.size);
  std::string joined;
  for (int r = 0; r < c.size; r++) joined.resize(joined.size() + lens[r]);
  mpi_host::all_gather_v(c, mine.data(), len, lens.data(), &joined[0]);
  for (int r = 0, at = 0; r < c.size; at += lens[r], r++) all[r] = joined.substr(at, lens[r]);
  return all;
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
