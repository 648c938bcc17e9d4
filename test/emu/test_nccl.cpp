// test/emu/test_nccl.cpp - the NCCL stand-in (test/emu/lib/nccl*.cpp) under mpirun, on every
// call parallel/comm_nccl.cu makes, against values every rank computes independently.
//
//   mpirun -np N test_nccl [SEED]      N >= 2 (CI: 3 and 4, oversubscribed); exit 1 on a failure
//
// Communicators are made as comm_nccl.cu makes them (group rank 0 draws the id, MPI_Bcast over the
// group's MPI communicator, ncclCommInitRank by the members only), over: the world; the even and
// the odd world ranks; {first, last} (the "embed" group of a pipeline) created while the middle
// ranks, which never join it, already run collectives over the world (a world-collective step
// inside ncclCommInitRank would deadlock there), the middle ranks' own group made later; and a
// second communicator over the world drawn right after the first (two ids from one root).
//
// On each: all-reduce (sum and max, fp32 and bf16, in place and not), reduce-scatter (in place
// and not), all-gather (in place and not, fp32, bf16 and bytes), broadcast from the first and the
// last rank, at counts 1, 7, 1001 and 262147 (1 MB, past every eager limit). Data are hashes of
// (seed, world rank, collective, index) that every rank can recompute: "exact" data are small
// multiples of a power of two whose sums are exact in any order (the results must be bit-equal);
// "general" data span seven binades, where fp32 sums must lie within (n-1) 2^-24 sum|x| of the
// float64 sum and bf16 sums within one bf16 ulp of it, and all ranks must hold the same bits.
// Point to point in groups: both directions of a ring at once (1 MB messages), both neighbours at
// once (two sends, two receives), an all-to-all including the send to oneself, and an uneven
// all-to-all-v with zero counts; outside groups: a send answered by a receive. Refusals: a
// collective inside a group, ncclProd, partly overlapping buffers, a send to oneself outside a
// group, a receive larger than the matching send, an unmatched ncclGroupEnd.
#include <mpi.h>
#include <nccl.h>
#include <cuda_bf16.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace {

struct Ctx {
  int world_rank = 0, world_size = 1;
  unsigned long long seed = 0;
  std::string where;
  long checks = 0, failures = 0;
  double worst_sum_ratio = 0.0;  // worst error of a rounding sum, as a fraction of its tolerance
};

void check(Ctx& ctx, bool ok, const std::string& what) {
  ++ctx.checks;
  if (!ok && ++ctx.failures <= 20)
    std::fprintf(stderr, "[rank %d] FAIL %s: %s\n", ctx.world_rank, ctx.where.c_str(), what.c_str());
}

unsigned long long mix(unsigned long long x) {  // splitmix64
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

float round_bf16(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

// Element i that world rank w contributes to collective `tag`. exact: multiples of 2^-8 below 128
// (fp32) or of 1/4 below 16 (bf16), so sums of four are exact; general: 7 binades, any sign.
float value(const Ctx& ctx, int w, int tag, size_t i, ncclDataType_t dt, bool exact) {
  const unsigned long long h = mix(ctx.seed ^ mix((unsigned long long)w << 40 ^ (unsigned long long)tag << 32 ^ i));
  if (exact && dt == ncclFloat32) return (float)((long long)(h % 65535) - 32767) / 256.0f;
  if (exact) return (float)((int)(h % 127) - 63) / 4.0f;
  const float unit = (float)((h >> 11) * 0x1.0p-53) * 2.0f - 1.0f;
  const float x = std::ldexp(unit, (int)(h % 7) - 3);
  return dt == ncclFloat32 ? x : round_bf16(x);
}

// A buffer of n elements of dt holding floats (fp32 or bf16), plus a poisoned tail of 2.
struct Buffer {
  ncclDataType_t dt;
  std::vector<char> bytes;
  size_t elem() const { return dt == ncclFloat32 ? 4 : dt == ncclBfloat16 ? 2 : 1; }
  Buffer(ncclDataType_t t, size_t n) : dt(t), bytes((n + 2) * elem(), (char)0xFF) {}
  void* at(size_t i) { return bytes.data() + i * elem(); }
  float get(size_t i) const {
    if (dt == ncclFloat32) { float f; std::memcpy(&f, &bytes[4 * i], 4); return f; }
    __nv_bfloat16 h; std::memcpy(&h, &bytes[2 * i], 2); return __bfloat162float(h);
  }
  void set(size_t i, float v) {
    if (dt == ncclFloat32) std::memcpy(&bytes[4 * i], &v, 4);
    else { __nv_bfloat16 h = __float2bfloat16_rn(v); std::memcpy(&bytes[2 * i], &h, 2); }
  }
  bool tail_poisoned(size_t n) const {
    for (size_t b = n * elem(); b < bytes.size(); b++) if (bytes[b] != (char)0xFF) return false;
    return true;
  }
};

// A group made the way parallel/comm_nccl.cu makes it.
struct Group {
  MPI_Comm mpi = MPI_COMM_NULL;
  ncclComm_t nccl = nullptr;
  int rank = 0, size = 1;
  std::vector<int> members;  // world ranks in group order
  std::string name;
  int calls = 0;  // checks run on the group so far
};

Group make_group(Ctx& ctx, MPI_Comm mpi, const std::string& name) {
  Group g;
  g.mpi = mpi, g.name = name;
  MPI_Comm_rank(mpi, &g.rank);
  MPI_Comm_size(mpi, &g.size);
  g.members.resize(g.size);
  MPI_Allgather(&ctx.world_rank, 1, MPI_INT, g.members.data(), 1, MPI_INT, mpi);
  ncclUniqueId id;
  if (g.rank == 0) check(ctx, ncclGetUniqueId(&id) == ncclSuccess, "ncclGetUniqueId");
  MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, mpi);
  check(ctx, ncclCommInitRank(&g.nccl, g.size, id, g.rank) == ncclSuccess, "ncclCommInitRank " + name);
  return g;
}

void destroy(Ctx& ctx, Group& g) {
  check(ctx, ncclCommDestroy(g.nccl) == ncclSuccess, "ncclCommDestroy");
  MPI_Comm_free(&g.mpi);
}

// Every member holds the same bytes (min and max of a hash over the group agree).
void check_same_everywhere(Ctx& ctx, const Group& g, const Buffer& b, size_t n, const char* what) {
  unsigned long long h = 0;
  for (size_t i = 0; i < n * b.elem(); i++) h = mix(h ^ (unsigned char)b.bytes[i]);
  unsigned long long lo = 0, hi = 0;
  MPI_Allreduce(&h, &lo, 1, MPI_UNSIGNED_LONG_LONG, MPI_MIN, g.mpi);
  MPI_Allreduce(&h, &hi, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, g.mpi);
  check(ctx, lo == hi, std::string(what) + ": ranks hold different results");
}

#include "test/emu/nccl_collective_checks.h"
#include "test/emu/nccl_p2p_checks.h"

void test_group(Ctx& ctx, Group& g) {
  const size_t counts[] = {1, 7, 1001, 262147};
  for (size_t n : counts)
    for (ncclDataType_t dt : {ncclFloat32, ncclBfloat16}) {
      ctx.where = g.name + (dt == ncclFloat32 ? " fp32" : " bf16") + " n=" + std::to_string(n);
      for (bool in_place : {false, true}) {
        test_all_reduce(ctx, g, n, dt, ncclSum, in_place, true);
        test_all_reduce(ctx, g, n, dt, ncclMax, in_place, false);
        test_reduce_scatter(ctx, g, n, dt, in_place);
        test_all_gather(ctx, g, n, dt, in_place);
      }
      test_all_reduce(ctx, g, n, dt, ncclSum, false, false);
      test_broadcast(ctx, g, n, dt, 0);
      test_broadcast(ctx, g, n, dt, g.size - 1);
    }
  ctx.where = g.name + " bytes";
  test_all_gather_bytes(ctx, g, 13);
  ctx.where = g.name + " p2p";
  for (size_t n : {(size_t)5, (size_t)262147}) {
    test_ring(ctx, g, n);
    test_both_neighbours(ctx, g, n);
  }
  test_all_to_all(ctx, g, 9);
  test_all_to_all_v(ctx, g, 6);
  test_lone_send_recv(ctx, g);
  test_refusals(ctx, g);
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  Ctx ctx;
  MPI_Comm_rank(MPI_COMM_WORLD, &ctx.world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ctx.world_size);
  ctx.seed = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : std::random_device{}();
  MPI_Bcast(&ctx.seed, 1, MPI_UNSIGNED_LONG_LONG, 0, MPI_COMM_WORLD);
  const int W = ctx.world_size, r = ctx.world_rank;
  if (W < 2) {
    std::fprintf(stderr, "test_nccl: run it under mpirun with at least 2 ranks\n");
    MPI_Finalize();
    return 2;
  }
  MPI_Comm dup, parity, ends, middle;
  MPI_Comm_dup(MPI_COMM_WORLD, &dup);
  MPI_Comm_split(MPI_COMM_WORLD, r % 2, r, &parity);
  const bool end = r == 0 || r == W - 1;
  MPI_Comm_split(MPI_COMM_WORLD, end ? 0 : MPI_UNDEFINED, r, &ends);
  MPI_Comm_split(MPI_COMM_WORLD, end ? MPI_UNDEFINED : 0, r, &middle);
  std::vector<Group> groups;
  groups.push_back(make_group(ctx, dup, "world"));
  MPI_Comm dup2;
  MPI_Comm_dup(MPI_COMM_WORLD, &dup2);
  groups.push_back(make_group(ctx, dup2, "world again"));
  groups.push_back(make_group(ctx, parity, r % 2 ? "odd ranks" : "even ranks"));
  // Only the members call ncclCommInitRank: the ends make theirs while the middle ranks go
  // straight on to collectives over the world communicator (a step of ncclCommInitRank that is
  // collective over MPI_COMM_WORLD would hang here); the middle ranks make their own afterwards.
  if (end) groups.push_back(make_group(ctx, ends, "first+last"));
  test_group(ctx, groups[0]);
  if (!end) groups.push_back(make_group(ctx, middle, "middle"));
  for (size_t i = 1; i < groups.size(); i++)
    if (groups[i].size > 1) test_group(ctx, groups[i]);
  for (Group& g : groups) destroy(ctx, g);
  long failures = 0, checks = 0;
  double worst = 0.0;
  MPI_Allreduce(&ctx.failures, &failures, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
  MPI_Allreduce(&ctx.checks, &checks, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
  MPI_Allreduce(&ctx.worst_sum_ratio, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  if (r == 0)
    std::printf("test_nccl: %d ranks, %ld checks, %ld failures; worst rounding sum at %.2f of its "
                "tolerance (seed %llu)\n", W, checks, failures, worst, ctx.seed);
  MPI_Finalize();
  return failures == 0 ? 0 : 1;
}
