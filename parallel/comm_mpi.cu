// parallel/comm_mpi.cu - the MPI backend of the collectives (see comm.h): host MPI calls on the
// group's communicator, synchronous.
//
// Buffers: on the CPU backend (ops::device_memory_is_host()) MPI reads and writes the caller's
// buffers directly. With GPU buffers every call first waits for the caller's stream (the input
// must be complete, and nothing queued may still read the output), copies the input down into
// a host staging buffer (Comm::staging, plain malloc, grown on demand and kept for the next call;
// ops has no pinned allocator and this is the slow path anyway), runs MPI on the host copies and
// copies the output back up. Layout of the staging buffer: [input | output], or one region for
// the in-place all-reduce and broadcast.
//
// Types: fp32 travels as MPI_FLOAT and sums with MPI_SUM. bf16 travels as MPI_UINT16_T (its bit
// pattern) and sums with a user-defined MPI_Op that adds in fp32 and rounds back to bf16 (nearest
// even), the same per-addition rounding a GPU reduction of bf16 values does. The op is created on
// first use and lives until MPI_Finalize (a function-local static: MPI ops are process-wide).
//
// Waiting: every call is MPI's nonblocking form, waited for by mpi_wait (comm_mpi_runtime.cu):
// it sleeps instead of spinning and ends the job past [parallel] timeout_s (parallel/watchdog.h).
//
// Determinism: OpenMPI picks a reduction algorithm from the group and message sizes only, so a
// given layout reduces in the same order on every run.
// Errors: MPI calls are not checked one by one; runtime_init (parallel/comm_mpi_runtime.cu)
// installs an error handler on MPI_COMM_WORLD, inherited by every group, that reports the MPI
// error and the rank through FATAL.
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "parallel/comm_mpi_internal.h"

namespace comm_mpi {
namespace {

MPI_Datatype mpi_type(DType dt) {
  switch (dt) {
    case DType::F32: return MPI_FLOAT;
    case DType::BF16: return MPI_UINT16_T;
    case DType::E4M3:
    case DType::E5M2: return MPI_UINT8_T;  // moved as bytes, never summed
    case DType::I8: return MPI_INT8_T;      // compressed gradients: moved, never summed
    case DType::I32: return MPI_INT32_T;
  }
  FATAL("MPI backend: no MPI type for dtype %d", (int)dt);
}

// inout[i] = bf16(float(in[i]) + float(inout[i])): commutative, so MPI may combine in any order.
void bf16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  const uint16_t* a = static_cast<const uint16_t*>(in);
  uint16_t* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = f32_to_bf16(bf16_to_f32(a[i]) + bf16_to_f32(b[i]));
}

MPI_Op sum_op(DType dt) {
  static MPI_Op bf16_op = [] {
    MPI_Op op;
    MPI_Op_create(bf16_sum, /*commute=*/1, &op);
    return op;
  }();
  switch (dt) {
    case DType::F32: return MPI_SUM;
    case DType::BF16: return bf16_op;
    case DType::E4M3:
    case DType::E5M2:
    case DType::I8:
    case DType::I32: break;
  }
  FATAL("MPI backend: no sum for dtype %d", (int)dt);
}

int mpi_count(size_t n) {
  CHECK(n <= (size_t)INT_MAX, "MPI backend: a message of %zu elements exceeds MPI's int count",
        n);
  return (int)n;
}

bool overlap(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const char* pa = static_cast<const char*>(a);
  const char* pb = static_cast<const char*>(b);
  return pa < pb + b_bytes && pb < pa + a_bytes;
}

// MPI's int counts and displacements (prefix sums of the counts) of an all-to-all-v, checked
// against int overflow; displs has c.size + 1 entries, the last the total.
void int_counts(const Comm& c, const size_t* counts, std::vector<int>& n,
                std::vector<int>& displs) {
  n.assign(c.size, 0);
  displs.assign(c.size + 1, 0);
  size_t at = 0;
  for (int j = 0; j < c.size; j++) {
    n[j] = mpi_count(counts[j]);
    displs[j] = mpi_count(at);
    at += counts[j];
  }
  displs[c.size] = mpi_count(at);
}

void* grow_staging(Comm& c, size_t bytes) {
  if (bytes > c.staging_bytes) {
    void* p = std::realloc(c.staging, bytes);
    CHECK(p, "MPI backend: cannot allocate %zu bytes of host staging memory", bytes);
    c.staging = p;
    c.staging_bytes = bytes;
  }
  return c.staging;
}

// The host buffers MPI works on for one call.
struct HostView {
  const void* in;
  void* out;
};

// in_place: the call has one buffer, read and written (all-reduce, broadcast), so in == out and
// in_bytes == out_bytes. Otherwise in and out may still overlap (reduce-scatter into a block of
// its input, all-gather from a block of its output). in_bytes may be 0 (recv), out_bytes 0 (send).
HostView stage_in(Comm& c, const void* in, size_t in_bytes, void* out, size_t out_bytes,
                  bool in_place, ops::Stream s) {
  if (ops::device_memory_is_host()) {
    if (in_place || !overlap(in, in_bytes, out, out_bytes)) return {in, out};
    // MPI forbids overlapping send and receive buffers: let it read a copy of the input.
    void* copy = grow_staging(c, in_bytes);
    std::memcpy(copy, in, in_bytes);
    return {copy, out};
  }
  ops::stream_sync(s);
  const size_t out_offset = in_place ? 0 : round_up(in_bytes, 64);
  char* host = static_cast<char*>(grow_staging(c, out_offset + (in_place ? in_bytes : out_bytes)));
  if (in_bytes > 0) ops::copy_to_host(host, in, in_bytes);
  return {host, host + out_offset};
}

void stage_out(const HostView& v, void* out, size_t out_bytes) {
  if (v.out != out && out_bytes > 0) ops::copy_to_device(out, v.out, out_bytes);
}

}  // namespace

void all_reduce_sum(Comm& c, void* buf, size_t count, DType dt, ops::Stream s) {
  const size_t bytes = count * dtype_size(dt);
  HostView v = stage_in(c, buf, bytes, buf, bytes, true, s);
  MPI_Request r;
  MPI_Iallreduce(MPI_IN_PLACE, v.out, mpi_count(count), mpi_type(dt), sum_op(dt), mpi_group(c),
                 &r);
  mpi_wait(c, 1, &r, MPI_STATUSES_IGNORE, "all-reduce");
  stage_out(v, buf, bytes);
}

void all_reduce_max(Comm& c, float* buf, size_t count, ops::Stream s) {
  const size_t bytes = count * sizeof(float);
  HostView v = stage_in(c, buf, bytes, buf, bytes, true, s);
  MPI_Request r;
  MPI_Iallreduce(MPI_IN_PLACE, v.out, mpi_count(count), MPI_FLOAT, MPI_MAX, mpi_group(c), &r);
  mpi_wait(c, 1, &r, MPI_STATUSES_IGNORE, "all-reduce (max)");
  stage_out(v, buf, bytes);
}

void reduce_scatter_sum(Comm& c, const void* send, void* recv, size_t recv_count, DType dt,
                        ops::Stream s) {
  const size_t out_bytes = recv_count * dtype_size(dt);
  HostView v = stage_in(c, send, c.size * out_bytes, recv, out_bytes, false, s);
  MPI_Request r;
  MPI_Ireduce_scatter_block(v.in, v.out, mpi_count(recv_count), mpi_type(dt), sum_op(dt),
                            mpi_group(c), &r);
  mpi_wait(c, 1, &r, MPI_STATUSES_IGNORE, "reduce-scatter");
  stage_out(v, recv, out_bytes);
}

void all_gather(Comm& c, const void* send, void* recv, size_t send_count, DType dt,
                ops::Stream s) {
  const size_t in_bytes = send_count * dtype_size(dt);
  HostView v = stage_in(c, send, in_bytes, recv, c.size * in_bytes, false, s);
  const int n = mpi_count(send_count);
  MPI_Request r;
  MPI_Iallgather(v.in, n, mpi_type(dt), v.out, n, mpi_type(dt), mpi_group(c), &r);
  mpi_wait(c, 1, &r, MPI_STATUSES_IGNORE, "all-gather");
  stage_out(v, recv, c.size * in_bytes);
}

void broadcast(Comm& c, void* buf, size_t count, DType dt, int root, ops::Stream s) {
  const size_t bytes = count * dtype_size(dt);
  HostView v = stage_in(c, buf, bytes, buf, bytes, true, s);
  MPI_Request r;
  MPI_Ibcast(v.out, mpi_count(count), mpi_type(dt), root, mpi_group(c), &r);
  mpi_wait(c, 1, &r, MPI_STATUSES_IGNORE, "broadcast");
  stage_out(v, buf, bytes);
}

// Every request is posted before any is waited for, so ranks exchanging with each other (a pair,
// a ring, a pipeline's neighbours) never wait on one another whatever the message size. The
// receives are posted first, so a message arriving early lands in place. With GPU buffers each
// op gets its own region of the staging buffer: sends copied down first, receives copied up
// after the Waitall.
void p2p_batch(Comm& c, const P2POp* ops, int n, DType dt, ops::Stream s) {
  const bool host = ops::device_memory_is_host();
  std::vector<size_t> offset(n + 1, 0);
  for (int i = 0; i < n; i++)
    offset[i + 1] = offset[i] + round_up(ops[i].count * dtype_size(dt), 64);
  char* staging = nullptr;
  if (!host) {
    ops::stream_sync(s);
    staging = static_cast<char*>(grow_staging(c, offset[n]));
    for (int i = 0; i < n; i++)
      if (ops[i].is_send)
        ops::copy_to_host(staging + offset[i], ops[i].buf, ops[i].count * dtype_size(dt));
  }
  auto buffer = [&](int i) { return host ? ops[i].buf : (void*)(staging + offset[i]); };
  std::vector<MPI_Request> req(n, MPI_REQUEST_NULL);
  for (int pass = 0; pass < 2; pass++)  // receives, then sends
    for (int i = 0; i < n; i++) {
      if (ops[i].is_send != (pass == 1)) continue;
      const int count = mpi_count(ops[i].count);
      if (ops[i].is_send)
        MPI_Isend(buffer(i), count, mpi_type(dt), ops[i].peer, ops[i].tag, mpi_group(c),
                  &req[i]);
      else
        MPI_Irecv(buffer(i), count, mpi_type(dt), ops[i].peer, ops[i].tag, mpi_group(c),
                  &req[i]);
    }
  std::vector<MPI_Status> status(n);
  char what[128];
  int at = std::snprintf(what, sizeof(what), "point-to-point");
  for (int i = 0; i < n && at < (int)sizeof(what); i++)
    at += std::snprintf(what + at, sizeof(what) - at, "%s%s %d", i ? ", " : " (",
                        ops[i].is_send ? "send to" : "recv from", ops[i].peer);
  if (at < (int)sizeof(what) - 1) std::snprintf(what + at, sizeof(what) - at, ")");
  mpi_wait(c, n, req.data(), status.data(), what);
  for (int i = 0; i < n; i++) {
    if (ops[i].is_send) continue;
    int received = 0;
    MPI_Get_count(&status[i], mpi_type(dt), &received);
    CHECK((size_t)received == ops[i].count,
          "receive on axis %s from rank %d: got %d elements, expected %zu", axis_name(c.axis),
          ops[i].peer, received, ops[i].count);
    if (!host) ops::copy_to_device(ops[i].buf, buffer(i), ops[i].count * dtype_size(dt));
  }
}

void all_to_all(Comm& c, const void* send, void* recv, size_t count, DType dt,
                ops::Stream s) {
  const size_t bytes = c.size * count * dtype_size(dt);
  HostView v = stage_in(c, send, bytes, recv, bytes, false, s);
  const int n = mpi_count(count);
  MPI_Request r;
  MPI_Ialltoall(v.in, n, mpi_type(dt), v.out, n, mpi_type(dt), mpi_group(c), &r);
  mpi_wait(c, 1, &r, MPI_STATUSES_IGNORE, "all-to-all");
  stage_out(v, recv, bytes);
}

void all_to_all_v(Comm& c, const void* send, const size_t* send_counts, void* recv,
                  const size_t* recv_counts, DType dt, ops::Stream s) {
  std::vector<int> sn, sd, rn, rd;
  int_counts(c, send_counts, sn, sd);
  int_counts(c, recv_counts, rn, rd);
  const size_t elem = dtype_size(dt);
  const size_t in_bytes = (size_t)sd[c.size] * elem, out_bytes = (size_t)rd[c.size] * elem;
  HostView v = stage_in(c, send, in_bytes, recv, out_bytes, false, s);
  MPI_Request r;
  MPI_Ialltoallv(v.in, sn.data(), sd.data(), mpi_type(dt), v.out, rn.data(), rd.data(),
                 mpi_type(dt), mpi_group(c), &r);
  mpi_wait(c, 1, &r, MPI_STATUSES_IGNORE, "all-to-all-v");
  stage_out(v, recv, out_bytes);
}

}  // namespace comm_mpi

const CollectiveBackend kMpiCollectives = {
    comm_mpi::all_reduce_sum, comm_mpi::all_reduce_max, comm_mpi::reduce_scatter_sum,
    comm_mpi::all_gather,     comm_mpi::broadcast,      comm_mpi::p2p_batch,
    comm_mpi::all_to_all,     comm_mpi::all_to_all_v};
