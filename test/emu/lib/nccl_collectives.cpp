// test/emu/lib/nccl_collectives.cpp - the NCCL stand-in's collectives over MPI (see nccl.cpp for
// communicators, groups and point-to-point): ncclAllReduce, ncclReduceScatter, ncclAllGather,
// ncclBroadcast, each queued on its stream as work that posts non-blocking MPI transfers and
// finishes once they complete (test/emu/include/emu_streams.h), so that a rank's streams can run
// beside a collective that waits for the other ranks, as on a GPU.
//
// Reductions are deterministic and identical on every rank, like NCCL's ring: the buffer is cut
// into nranks blocks, every rank sends its copy of block r to rank r, rank r reduces them in
// rank order 0, 1, ..., n-1, and (all-reduce) sends the reduced block to everyone. The messages'
// tags carry the collective's serial number on its communicator, so collectives of one
// communicator match across ranks in the order they were called, whatever order the streams
// run them in. fp32 sums add in fp32 in that order; bf16 sums add in fp32 and round to
// bf16 once per element (NCCL rounds to bf16 after every hop of its ring, which a bf16 result
// may differ from by a few bf16 ulps; both are sums of the same values). Max propagates NaN.
// Implemented reductions: sum and max on fp32 and bf16 (what parallel/comm_nccl.cu asks for);
// any other op or type is refused with ncclInvalidUsage. All-gather and broadcast move any type.
// In place is NCCL's: all-reduce and broadcast with sendbuff == recvbuff, reduce-scatter with
// recvbuff at block `rank` of sendbuff, all-gather with sendbuff at block `rank` of recvbuff; any
// other overlap of the two buffers is refused. Collectives inside ncclGroupStart/End are refused
// (the project groups only sends and receives). Messages over 2 GiB are refused (MPI int counts).
#include <cuda_bf16.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <vector>

#include "test/emu/include/emu_streams.h"
#include "test/emu/include/emu_counts.h"
#include "test/emu/lib/nccl_state.h"

using namespace nccl_standin;

namespace {

constexpr size_t kMaxBytes = 0x7fffffff;

float load(const char* base, size_t i, ncclDataType_t dt) {
  if (dt == ncclFloat32) return reinterpret_cast<const float*>(base)[i];
  return __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(base)[i]);
}
void store(char* base, size_t i, ncclDataType_t dt, float v) {
  if (dt == ncclFloat32)
    reinterpret_cast<float*>(base)[i] = v;
  else
    reinterpret_cast<__nv_bfloat16*>(base)[i] = __float2bfloat16_rn(v);
}

// out[i] = slices[0][i] op slices[1][i] op ... in rank order, accumulated in fp32.
void reduce_slices(const char* slices, size_t count, int n, ncclDataType_t dt, ncclRedOp_t op,
                   char* out) {
  const size_t slice_bytes = count * type_size(dt);
  for (size_t i = 0; i < count; i++) {
    float acc = load(slices, i, dt);
    for (int r = 1; r < n; r++) {
      const float v = load(slices + r * slice_bytes, i, dt);
      if (op == ncclSum)
        acc += v;
      else
        acc = std::isnan(acc) || std::isnan(v) ? NAN : (v > acc ? v : acc);
    }
    store(out, i, dt, acc);
  }
}

// The checks every collective shares; `bytes` is the largest buffer it moves.
ncclResult_t check_collective(ncclComm* comm, ncclDataType_t dt, size_t bytes, const char* fn) {
  if (!comm) return ncclInvalidArgument;
  if (type_size(dt) == 0) return fail(ncclInvalidArgument, std::string(fn) + ": data type");
  if (inside_group())
    return fail(ncclInvalidUsage, std::string(fn) + " inside ncclGroupStart/End is not implemented");
  if (bytes > kMaxBytes) return fail(ncclInvalidUsage, std::string(fn) + ": over 2 GiB is not implemented");
  return ncclSuccess;
}

ncclResult_t check_reduction(ncclDataType_t dt, ncclRedOp_t op, const char* fn) {
  if ((dt == ncclFloat32 || dt == ncclBfloat16) && (op == ncclSum || op == ncclMax))
    return ncclSuccess;
  return fail(ncclInvalidUsage, std::string(fn) + ": reduction " + std::to_string((int)op) +
                                    " on type " + std::to_string((int)dt) +
                                    " (sum and max on fp32 and bf16 are implemented)");
}

// One collective as stream work (test/emu/include/emu_streams.h): each step either posts the
// MPI transfers of the next phase or finds the posted ones incomplete. Phase 1 of a reduction
// brings every rank's copy of block r to rank r (the slices), phase 2 (all-reduce) hands the
// reduced blocks to everyone; the tags carry the collective's serial number on its communicator.
struct Collective {
  ncclComm* comm;
  uint64_t serial;
  ncclDataType_t dt;
  ncclRedOp_t op;
  const char* send;
  char* recv;
  std::vector<size_t> counts, offsets;  // the blocks, in elements
  int phase = 0;
  Transfers transfers;
  std::vector<char> slices, mine;

  size_t elem() const { return type_size(dt); }
  size_t block_bytes(int j) const { return counts[j] * elem(); }
  int tag(TagKind k) const { return tag_of(k, serial); }

  // Phase 1: every rank's block `rank` of `send` into slices, in rank order.
  void post_slices() {
    const int n = comm->nranks, me = comm->rank;
    const size_t mine_bytes = block_bytes(me);
    slices.assign(n * mine_bytes + 1, 0);
    for (int j = 0; j < n; j++) {
      if (j == me) continue;
      transfers.recv(slices.data() + j * mine_bytes, mine_bytes, j, tag(kTagPhase1), comm->mpi);
      transfers.send(send + offsets[j] * elem(), block_bytes(j), j, tag(kTagPhase1), comm->mpi);
    }
    std::memcpy(slices.data() + me * mine_bytes, send + offsets[me] * elem(), mine_bytes);
  }
  void reduce_mine() {
    mine.assign(block_bytes(comm->rank) + 1, 0);
    reduce_slices(slices.data(), counts[comm->rank], comm->nranks, dt, op, mine.data());
  }
  // Phase 2 of an all-reduce (and an all-gather's only phase): block j of recv from rank j.
  void post_gather(const char* my_block) {
    const int n = comm->nranks, me = comm->rank;
    for (int j = 0; j < n; j++) {
      if (j == me) continue;
      transfers.recv(recv + offsets[j] * elem(), block_bytes(j), j, tag(kTagPhase2), comm->mpi);
      transfers.send(my_block, block_bytes(me), j, tag(kTagPhase2), comm->mpi);
    }
    std::memmove(recv + offsets[me] * elem(), my_block, block_bytes(me));
  }
};

Collective* new_collective(ncclComm* comm, ncclDataType_t dt, ncclRedOp_t op, const void* send,
                           void* recv) {
  Collective* c = new Collective;
  c->comm = comm;
  c->serial = 0;  // taken when the work is made (submit_collective)
  c->dt = dt;
  c->op = op;
  c->send = static_cast<const char*>(send);
  c->recv = static_cast<char*>(recv);
  return c;
}

// Each run of the call (the call itself, or each replay of a captured graph) is a new collective
// with the next serial number on its communicator (test/emu/graphs.cpp).
void submit_collective(Collective* raw, cudaStream_t stream, const char* fn,
                       std::function<bool(Collective&)> step) {
  std::shared_ptr<const Collective> pristine(raw);
  size_t payload = 0;  // the call's largest buffer: the sum of the blocks
  for (size_t n : pristine->counts) payload += n * type_size(pristine->dt);
  emu::submit_made(stream, fn, [pristine, step, fn, payload]() -> emu::StreamWork {
    auto c = std::make_shared<Collective>(*pristine);
    c->serial = c->comm->collectives++;
    auto counted = std::make_shared<bool>(false);  // once per run, however often it is polled
    return [c, step, fn, payload, counted] {
      if (!*counted) emu::note_library_call({fn, 0, 0, 0, (double)payload});  // EMU_COUNTS
      *counted = true;
      return step(*c);
    };
  });
}

}  // namespace

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t dt,
                           ncclRedOp_t op, ncclComm_t handle, cudaStream_t stream) {
  const char* fn = "ncclAllReduce";
  ncclComm* comm = comm_of(handle, fn);
  const size_t elem = type_size(dt), bytes = count * elem;
  ncclResult_t r = check_collective(comm, dt, bytes, fn);
  if (r == ncclSuccess) r = check_reduction(dt, op, fn);
  if (r != ncclSuccess) return r;
  if (send != recv && overlaps(send, bytes, recv, bytes))
    return fail(ncclInvalidArgument, "ncclAllReduce: the buffers overlap without being equal");
  Collective* c = new_collective(comm, dt, op, send, recv);
  const int n = comm->nranks;
  size_t at = 0;
  for (int j = 0; j < n; j++) {
    c->counts.push_back(count / n + ((size_t)j < count % n ? 1 : 0));
    c->offsets.push_back(at);
    at += c->counts[j];
  }
  submit_collective(c, stream, fn, [](Collective& c) {
    if (c.phase == 0) c.post_slices(), c.phase = 1;
    if (!c.transfers.complete()) return false;
    if (c.phase == 2) return true;
    c.reduce_mine();
    c.transfers.requests.clear();
    c.post_gather(c.mine.data());
    c.phase = 2;
    return c.transfers.complete();
  });
  return ncclSuccess;
}

ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t recv_count, ncclDataType_t dt,
                               ncclRedOp_t op, ncclComm_t handle, cudaStream_t stream) {
  const char* fn = "ncclReduceScatter";
  ncclComm* comm = comm_of(handle, fn);
  const size_t elem = type_size(dt), block = recv_count * elem;
  ncclResult_t r = check_collective(comm, dt, comm ? block * comm->nranks : 0, fn);
  if (r == ncclSuccess) r = check_reduction(dt, op, fn);
  if (r != ncclSuccess) return r;
  const int n = comm->nranks;
  const char* in_place = static_cast<const char*>(send) + comm->rank * block;
  if (recv != in_place && overlaps(send, block * n, recv, block))
    return fail(ncclInvalidArgument, "ncclReduceScatter: recvbuff overlaps sendbuff off its block");
  Collective* c = new_collective(comm, dt, op, send, recv);
  for (int j = 0; j < n; j++) c->counts.push_back(recv_count), c->offsets.push_back(j * recv_count);
  submit_collective(c, stream, fn, [](Collective& c) {
    if (c.phase == 0) c.post_slices(), c.phase = 1;
    if (!c.transfers.complete()) return false;
    c.reduce_mine();
    std::memcpy(c.recv, c.mine.data(), c.block_bytes(c.comm->rank));
    return true;
  });
  return ncclSuccess;
}

ncclResult_t ncclAllGather(const void* send, void* recv, size_t send_count, ncclDataType_t dt,
                           ncclComm_t handle, cudaStream_t stream) {
  const char* fn = "ncclAllGather";
  ncclComm* comm = comm_of(handle, fn);
  const size_t block = send_count * type_size(dt);
  ncclResult_t r = check_collective(comm, dt, comm ? block * comm->nranks : 0, fn);
  if (r != ncclSuccess) return r;
  const char* in_place = static_cast<const char*>(recv) + comm->rank * block;
  if (send != in_place && overlaps(send, block, recv, block * comm->nranks))
    return fail(ncclInvalidArgument, "ncclAllGather: sendbuff overlaps recvbuff off its block");
  Collective* c = new_collective(comm, dt, ncclSum, send, recv);
  for (int j = 0; j < comm->nranks; j++)
    c->counts.push_back(send_count), c->offsets.push_back(j * send_count);
  submit_collective(c, stream, fn, [](Collective& c) {
    if (c.phase == 0) {
      c.mine.assign(c.send, c.send + c.block_bytes(c.comm->rank));
      c.mine.push_back(0);  // never empty, so data() is a valid pointer
      c.post_gather(c.mine.data());
      c.phase = 1;
    }
    return c.transfers.complete();
  });
  return ncclSuccess;
}

ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t dt, int root,
                           ncclComm_t handle, cudaStream_t stream) {
  const char* fn = "ncclBroadcast";
  ncclComm* comm = comm_of(handle, fn);
  const size_t bytes = count * type_size(dt);
  ncclResult_t r = check_collective(comm, dt, bytes, fn);
  if (r != ncclSuccess) return r;
  if (root < 0 || root >= comm->nranks)
    return fail(ncclInvalidArgument, "ncclBroadcast: root " + std::to_string(root));
  if (comm->rank == root && send != recv && overlaps(send, bytes, recv, bytes))
    return fail(ncclInvalidArgument, "ncclBroadcast: the buffers overlap without being equal");
  Collective* c = new_collective(comm, dt, ncclSum, send, recv);
  c->counts.push_back(count);
  submit_collective(c, stream, fn, [root](Collective& c) {
    if (c.phase == 0) {
      const size_t bytes = c.block_bytes(0);
      if (c.comm->rank == root) {
        if (c.send != c.recv) std::memcpy(c.recv, c.send, bytes);
        for (int j = 0; j < c.comm->nranks; j++)
          if (j != root) c.transfers.send(c.recv, bytes, j, c.tag(kTagPhase1), c.comm->mpi);
      } else {
        c.transfers.recv(c.recv, bytes, root, c.tag(kTagPhase1), c.comm->mpi);
      }
      c.phase = 1;
    }
    return c.transfers.complete();
  });
  return ncclSuccess;
}
