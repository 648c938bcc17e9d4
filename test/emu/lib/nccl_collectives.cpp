// test/emu/lib/nccl_collectives.cpp - the NCCL stand-in's collectives over MPI (see nccl.cpp for
// communicators, groups and point-to-point): ncclAllReduce, ncclReduceScatter, ncclAllGather,
// ncclBroadcast, each complete when it returns (emulated streams are synchronous).
//
// Reductions are deterministic and identical on every rank, like NCCL's ring: the buffer is cut
// into nranks blocks, an MPI all-to-all brings every rank's copy of block r to rank r, rank r
// reduces them in rank order 0, 1, ..., n-1, and (all-reduce) an MPI all-gather hands the reduced
// blocks to everyone. fp32 sums add in fp32 in that order; bf16 sums add in fp32 and round to
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
#include <vector>

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

// Rank r's block of the reduction of every rank's `send` (blocks of `counts`, at `offsets`):
// all-to-all of the blocks, then the reduction in rank order into `out` (counts[rank] elements).
void reduce_my_block(ncclComm* comm, const void* send, const std::vector<size_t>& counts,
                     const std::vector<size_t>& offsets, ncclDataType_t dt, ncclRedOp_t op,
                     char* out) {
  const int n = comm->nranks;
  const size_t elem = type_size(dt), mine = counts[comm->rank];
  std::vector<int> send_bytes(n), send_at(n), recv_bytes(n), recv_at(n);
  for (int j = 0; j < n; j++) {
    send_bytes[j] = (int)(counts[j] * elem), send_at[j] = (int)(offsets[j] * elem);
    recv_bytes[j] = (int)(mine * elem), recv_at[j] = (int)(j * mine * elem);
  }
  std::vector<char> slices(n * mine * elem + 1);
  MPI_Alltoallv(send, send_bytes.data(), send_at.data(), MPI_BYTE, slices.data(),
                recv_bytes.data(), recv_at.data(), MPI_BYTE, comm->mpi);
  reduce_slices(slices.data(), mine, n, dt, op, out);
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
  const int n = comm->nranks;
  std::vector<size_t> counts(n), offsets(n);
  size_t at = 0;
  for (int j = 0; j < n; j++) {
    counts[j] = count / n + ((size_t)j < count % n ? 1 : 0);
    offsets[j] = at;
    at += counts[j];
  }
  std::vector<char> mine(counts[comm->rank] * elem + 1);
  reduce_my_block(comm, send, counts, offsets, dt, op, mine.data());
  std::vector<int> block_bytes(n), block_at(n);
  for (int j = 0; j < n; j++) block_bytes[j] = (int)(counts[j] * elem), block_at[j] = (int)(offsets[j] * elem);
  MPI_Allgatherv(mine.data(), block_bytes[comm->rank], MPI_BYTE, recv, block_bytes.data(),
                 block_at.data(), MPI_BYTE, comm->mpi);
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
  std::vector<size_t> counts(n, recv_count), offsets(n);
  for (int j = 0; j < n; j++) offsets[j] = j * recv_count;
  std::vector<char> mine(block + 1);
  reduce_my_block(comm, send, counts, offsets, dt, op, mine.data());
  std::memcpy(recv, mine.data(), block);
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
  std::vector<char> mine(static_cast<const char*>(send), static_cast<const char*>(send) + block);
  mine.push_back(0);  // never empty, so data() is a valid pointer
  MPI_Allgather(mine.data(), (int)block, MPI_BYTE, recv, (int)block, MPI_BYTE, comm->mpi);
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
  if (comm->rank == root && send != recv) {
    if (overlaps(send, bytes, recv, bytes))
      return fail(ncclInvalidArgument, "ncclBroadcast: the buffers overlap without being equal");
    std::memcpy(recv, send, bytes);
  }
  MPI_Bcast(recv, (int)bytes, MPI_BYTE, root, comm->mpi);
  return ncclSuccess;
}
