// test/test_comm.cpp - the communicator and the device mesh (parallel/comm.*, parallel/mesh.*),
// run under mpirun on CPU ranks. test/test_mesh.py drives it.
// The bookkeeping (checks, expected data) is in test/comm_test_support.h, the point-to-point
// checks in test/comm_point_to_point.h; this file holds the mesh, the collectives and main.
//
//   mpirun -np N test_comm            every mesh layout of N ranks (all orders of the factors of
//                                     N over dp, pp, cp, tp; every ep dividing dp*cp). For each:
//                                     coordinates, group members (against the documented rank
//                                     formula), every collective on every axis in fp32 and bf16
//                                     (exact expected values), the paired send_recv (a ring, a
//                                     pipeline-like exchange with both neighbours, one-sided
//                                     calls, a p2p_batch of four to both neighbours, 1 MB
//                                     messages), all_to_all_v with uneven counts (zeros
//                                     included), the host helpers, the counters
//                                     (equal to the analytic calls/bytes) and the printed summary.
//   test_comm count                   the Count backend (the planner's), one process: for every
//                                     layout of 8 ranks and every rank, its groups against the
//                                     formula, every collective counted by the payload rules and
//                                     moving nothing, the host helpers as if all ranks were it
//   test_comm validate W dp tp pp cp ep n_head seq_len n_layer
//                                     prints layout_problems' verdict ("ok" or the message)
//   mpirun -np N test_comm layout dp tp pp cp ep [nccl]
//                                     mesh_init alone; rank 0 prints "ok" (or the job dies)
//   mpirun -np N test_comm fatal|throw|hang
//                                     rank 1 calls FATAL / throws / SIGKILLs itself while the
//                                     others wait in an all-reduce
//
// Expected values are exact: the data are random but chosen so that every partial sum is
// representable (fp32: multiples of 2^-8 below 128; bf16: multiples of 1/4 below 16, four
// ranks at most), so any reduction order gives the same bits. Groups of two ranks also get
// general random values, where a sum is one rounding: fp32 a+b, bf16 round(float(a)+float(b)).
// Each value is a hash of (seed, world rank, collective, index), so every rank can compute what
// any other rank sent. Seed: env COMM_TEST_SEED, else drawn by rank 0 and printed.
//
// Env COMM_TEST_BACKEND=nccl runs the suite on the NCCL backend instead of MPI: a binary linked
// with the CUDA backend and parallel/comm_nccl.cu, one GPU per rank (not built by default).
//
// Built with -DCOMM_TEST_FAKE_DEVICE the program carries its own ops memory functions instead of
// the CPU backend: a pretend GPU whose buffers are host pages kept inaccessible (PROT_NONE)
// except inside ops::copy_*, with device_memory_is_host() false. The MPI backend then has to
// stage through host memory, and any direct MPI access to a "device" buffer crashes.
#include <signal.h>
#include <sys/mman.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "parallel/comm_mpi_internal.h"  // the test checks the MPI groups themselves
#include "parallel/mesh.h"
#include "test/comm_send_recv.h"

#ifdef COMM_TEST_FAKE_DEVICE
namespace ops {
struct StreamImpl {};
namespace {
std::map<char*, size_t>& regions() {  // base -> mapped bytes of every live "device" buffer
  static std::map<char*, size_t> r;
  return r;
}
// Opens (read-write) or closes (no access) the buffer holding p; aborts on a stray pointer.
void set_access(const void* p, bool open) {
  auto it = regions().upper_bound((char*)p);
  CHECK(it != regions().begin(), "fake device: %p is not a device pointer", p);
  --it;
  CHECK((char*)p < it->first + it->second, "fake device: %p is not a device pointer", p);
  mprotect(it->first, it->second, open ? PROT_READ | PROT_WRITE : PROT_NONE);
}
// memmove with the device buffers among dst and src open for the copy only.
void guarded_move(void* dst, bool dst_on_device, const void* src, bool src_on_device, size_t n) {
  if (n == 0) return;
  if (dst_on_device) set_access(dst, true);
  if (src_on_device) set_access(src, true);
  std::memmove(dst, src, n);
  if (dst_on_device) set_access(dst, false);
  if (src_on_device) set_access(src, false);
}
}  // namespace
bool device_memory_is_host() { return false; }
void* alloc(size_t bytes) {
  const size_t mapped = round_up(bytes + 1, 4096);
  void* p = mmap(nullptr, mapped, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  CHECK(p != MAP_FAILED, "fake device: mmap of %zu bytes failed", mapped);
  regions()[(char*)p] = mapped;
  return p;
}
void release(void* p) {
  if (!p) return;
  munmap(p, regions().at((char*)p));
  regions().erase((char*)p);
}
void copy_to_device(void* dst, const void* src, size_t n) { guarded_move(dst, 1, src, 0, n); }
void copy_to_host(void* dst, const void* src, size_t n) { guarded_move(dst, 0, src, 1, n); }
void copy_on_device(void* dst, const void* src, size_t n, Stream) {
  guarded_move(dst, 1, src, 1, n);
}
void stream_sync(Stream) {}
// The trace recorder's (kernels/trace.h) events: never used, no step is traced here.
struct EventImpl {};
Event event_create() { return new EventImpl; }
void event_destroy(Event e) { delete e; }
void event_record(Event, Stream) {}
void event_sync(Event) {}
float event_elapsed_ms(Event, Event) { return 0; }
void range_push(const char*) {}
void range_pop() {}
}  // namespace ops
#endif

namespace {

#include "test/comm_test_support.h"
#include "test/comm_point_to_point.h"

// ---------------------------------------------------------------------------------------------
// Coordinates and groups from the documented formula (mesh.h)
// ---------------------------------------------------------------------------------------------
struct Coord {
  int dp, pp, cp, tp, dpcp, ep_block, ep;
};

// world_rank = ((dp_rank * pp + pp_rank) * cp + cp_rank) * tp + tp_rank, tabulated forwards.
std::vector<Coord> coordinates(const Layout& L) {
  std::vector<Coord> table(L.dp * L.pp * L.cp * L.tp);
  for (int d = 0; d < L.dp; ++d)
    for (int p = 0; p < L.pp; ++p)
      for (int c = 0; c < L.cp; ++c)
        for (int t = 0; t < L.tp; ++t) {
          const int dpcp = d * L.cp + c;
          table[((d * L.pp + p) * L.cp + c) * L.tp + t] = {d, p, c, t, dpcp, dpcp / L.ep,
                                                           dpcp % L.ep};
        }
  return table;
}

// (what members share, position in the group) of a rank on an axis, as mesh.h defines the groups.
std::pair<std::array<int, 3>, int> group_key(Axis a, const Coord& c, int w, const Layout& L) {
  const bool end = L.pp > 1 && (c.pp == 0 || c.pp == L.pp - 1);  // of its pipeline
  switch (a) {
    case Axis::World: return {{0, 0, 0}, w};
    case Axis::DP: return {{c.pp, c.cp, c.tp}, c.dp};
    case Axis::TP: return {{c.dp, c.pp, c.cp}, c.tp};
    case Axis::PP: return {{c.dp, c.cp, c.tp}, c.pp};
    case Axis::CP: return {{c.dp, c.pp, c.tp}, c.cp};
    case Axis::DPCP: return {{c.pp, c.tp, 0}, c.dpcp};
    case Axis::EP: return {{c.pp, c.tp, c.ep_block}, c.ep};
    case Axis::Stage: return {{c.pp, 0, 0}, w};
    case Axis::Embed:  // the two ends of a pipeline together; anyone else alone
      return end ? std::pair<std::array<int, 3>, int>{{c.dpcp, c.tp, 0}, c.pp}
                 : std::pair<std::array<int, 3>, int>{{-1 - w, 0, 0}, 0};
    case Axis::Island: return {{-1 - w, 0, 0}, 0};  // no DiLoCo islands here: alone
    case Axis::IslandWorld: return {{0, 0, 0}, w};   // ... so one island: the world
    case Axis::CPA2A:                                // cp_comm "ring" here: alone
    case Axis::CPRing: return {{-1 - w, 0, 0}, 0};
    case Axis::DPShard: case Axis::DPReplica: case Axis::DPCPShard: case Axis::DPCPReplica:
    case Axis::EPDPShard: case Axis::EPDPReplica:
      return {{-1 - w, 0, 0}, 0};  // no HSDP here (dp_replicate = 1): alone
    default: return {{c.pp, c.tp, c.ep}, c.ep_block};  // EPDP
  }
}

// World ranks of my group on axis a, in group-rank order.
std::vector<int> expected_members(const std::vector<Coord>& table, const Layout& L, Axis a,
                                  int me) {
  std::vector<std::pair<int, int>> by_key;  // (key, world rank)
  for (int w = 0; w < (int)table.size(); ++w)
    if (group_key(a, table[w], w, L).first == group_key(a, table[me], me, L).first)
      by_key.push_back({group_key(a, table[w], w, L).second, w});
  std::sort(by_key.begin(), by_key.end());
  std::vector<int> members;
  for (auto& kw : by_key) members.push_back(kw.second);
  return members;
}

std::vector<int> actual_members(const Comm& c) {
  MPI_Group group, world;
  MPI_Comm_group(mpi_group(c), &group);
  MPI_Comm_group(MPI_COMM_WORLD, &world);
  std::vector<int> ranks(c.size), members(c.size);
  for (int i = 0; i < c.size; ++i) ranks[i] = i;
  MPI_Group_translate_ranks(group, c.size, ranks.data(), world, members.data());
  MPI_Group_free(&group);
  MPI_Group_free(&world);
  return members;
}

// ---------------------------------------------------------------------------------------------
// The collectives on one axis
// ---------------------------------------------------------------------------------------------

void test_all_reduce(Ctx& ctx, Comm& c, const std::vector<int>& M, size_t n, DType dt,
                     bool exact) {
  void* buf = upload(values(ctx, ctx.world_rank, kAllReduce, n, dt, exact), dt);
  all_reduce_sum(c, buf, n, dt, nullptr);
  expect_call(ctx, c, CollectiveKind::AllReduce, n * dtype_size(dt));
  std::vector<float> want(n, 0.0f);
  for (int m : M)
    for (size_t i = 0; i < n; ++i) want[i] += value(ctx, m, kAllReduce, i, dt, exact);
  if (dt == DType::BF16) for (float& x : want) x = round_bf16(x);  // exact, or one rounding
  check_values(ctx, download(buf, n, dt), want, exact ? "all_reduce_sum" : "all_reduce_sum pair");
  ops::release(buf);
}

// in_place: recv is block c.rank of the send buffer (the NCCL in-place convention).
void test_reduce_scatter(Ctx& ctx, Comm& c, const std::vector<int>& M, size_t n, DType dt,
                         bool exact, bool in_place) {
  const size_t total = c.size * n;
  void* send = upload(values(ctx, ctx.world_rank, kReduceScatter, total, dt, exact), dt);
  void* recv = in_place ? (char*)send + c.rank * n * dtype_size(dt) : poisoned(n, dt);
  reduce_scatter_sum(c, send, recv, n, dt, nullptr);
  expect_call(ctx, c, CollectiveKind::ReduceScatter, total * dtype_size(dt));
  std::vector<float> want(n, 0.0f);
  for (int m : M)
    for (size_t i = 0; i < n; ++i)
      want[i] += value(ctx, m, kReduceScatter, c.rank * n + i, dt, exact);
  if (dt == DType::BF16) for (float& x : want) x = round_bf16(x);
  check_values(ctx, download(recv, n, dt), want,
               in_place ? "reduce_scatter in place" : "reduce_scatter");
  if (!in_place) ops::release(recv);
  ops::release(send);
}

// in_place: send is block c.rank of the receive buffer.
void test_all_gather(Ctx& ctx, Comm& c, const std::vector<int>& M, size_t n, DType dt,
                     bool in_place) {
  std::vector<float> mine = values(ctx, ctx.world_rank, kAllGather, n, dt, true);
  void* send = nullptr;
  void* recv = nullptr;
  if (in_place) {
    std::vector<float> full(c.size * n, poison(dt));
    std::copy(mine.begin(), mine.end(), full.begin() + c.rank * n);
    recv = upload(full, dt);
    send = (char*)recv + c.rank * n * dtype_size(dt);
  } else {
    send = upload(mine, dt);
    recv = poisoned(c.size * n, dt);
  }
  all_gather(c, send, recv, n, dt, nullptr);
  expect_call(ctx, c, CollectiveKind::AllGather, c.size * n * dtype_size(dt));
  std::vector<float> want;
  for (int m : M) {
    std::vector<float> block = values(ctx, m, kAllGather, n, dt, true);
    want.insert(want.end(), block.begin(), block.end());
  }
  check_values(ctx, download(recv, c.size * n, dt), want,
               in_place ? "all_gather in place" : "all_gather");
  ops::release(recv);
  if (!in_place) ops::release(send);
}

void test_broadcast(Ctx& ctx, Comm& c, const std::vector<int>& M, size_t n, DType dt, int root) {
  void* buf = upload(values(ctx, ctx.world_rank, kBroadcast, n, dt, true), dt);
  broadcast(c, buf, n, dt, root, nullptr);
  expect_call(ctx, c, CollectiveKind::Broadcast, n * dtype_size(dt));
  check_values(ctx, download(buf, n, dt), values(ctx, M[root], kBroadcast, n, dt, true),
               root == 0 ? "broadcast from 0" : "broadcast from the last rank");
  ops::release(buf);
}

void test_all_to_all(Ctx& ctx, Comm& c, const std::vector<int>& M, size_t n, DType dt) {
  void* send = upload(values(ctx, ctx.world_rank, kAllToAll, c.size * n, dt, true), dt);
  void* recv = poisoned(c.size * n, dt);
  all_to_all(c, send, recv, n, dt, nullptr);
  expect_call(ctx, c, CollectiveKind::AllToAll, c.size * n * dtype_size(dt));
  std::vector<float> want;  // block j: what rank j sent to me (its block c.rank)
  for (int m : M)
    for (size_t i = 0; i < n; ++i)
      want.push_back(value(ctx, m, kAllToAll, c.rank * n + i, dt, true));
  check_values(ctx, download(recv, c.size * n, dt), want, "all_to_all");
  ops::release(send);
  ops::release(recv);
}

// Elements group rank `from` sends to group rank `to` in all_to_all_v: uneven, from 0 (about a
// quarter of the pairs, self included on some ranks; with n = 1 all of rank 0's sends) to
// n + 3 from + to. Higher ranks send more than they receive, so a count of the received bytes
// instead of the sent ones shows in the counters.
size_t a2av_count(int from, int to, size_t n) {
  if ((from * 7 + to * 3 + n) % 4 == 1 || (n == 1 && from == 0)) return 0;
  return n + 3 * from + to;
}

// Every rank's send buffer holds its blocks for ranks 0, 1, ... back to back; the receiver
// rebuilds each sender's buffer layout from the counts to know what it must get. Two elements
// past the received total stay poisoned (nothing is written beyond the blocks).
void test_all_to_all_v(Ctx& ctx, Comm& c, const std::vector<int>& M, size_t n, DType dt) {
  std::vector<size_t> send_counts(c.size), recv_counts(c.size);
  size_t send_total = 0, recv_total = 0;
  for (int j = 0; j < c.size; ++j) {
    send_total += send_counts[j] = a2av_count(c.rank, j, n);
    recv_total += recv_counts[j] = a2av_count(j, c.rank, n);
  }
  void* send = upload(values(ctx, ctx.world_rank, kAllToAllV, send_total, dt, true), dt);
  void* recv = poisoned(recv_total + 2, dt);
  all_to_all_v(c, send, send_counts.data(), recv, recv_counts.data(), dt, nullptr);
  expect_call(ctx, c, CollectiveKind::AllToAll, send_total * dtype_size(dt));
  std::vector<float> want;  // block j: rank j's block for me, at its offset in j's send buffer
  for (int j = 0; j < c.size; ++j) {
    size_t offset = 0;
    for (int k = 0; k < c.rank; ++k) offset += a2av_count(j, k, n);
    for (size_t i = 0; i < recv_counts[j]; ++i)
      want.push_back(value(ctx, M[j], kAllToAllV, offset + i, dt, true));
  }
  const std::vector<float> got = download(recv, recv_total + 2, dt);
  check_values(ctx, std::vector<float>(got.begin(), got.begin() + recv_total), want,
               "all_to_all_v");
  check(ctx, is_poison(got[recv_total], dt) && is_poison(got[recv_total + 1], dt),
        "all_to_all_v wrote past its blocks");
  ops::release(send);
  ops::release(recv);
}

void test_host_helpers(Ctx& ctx, Comm& c, const std::vector<int>& M) {
  double sum = 0, max = 0;
  for (int m : M) sum += m + 1, max = std::max(max, 1.5 * m);
  check(ctx, all_reduce_host_sum(c, ctx.world_rank + 1) == sum, "all_reduce_host_sum");
  check(ctx, all_reduce_host_max(c, 1.5 * ctx.world_rank) == max, "all_reduce_host_max");
  check(ctx, all_agree(c, true), "all_agree(true everywhere)");
  check(ctx, !all_agree(c, c.rank != c.size - 1), "all_agree(false on the last rank)");
}

// 4099 elements (8 kB in bf16) are past the 4 kB eager limit of OpenMPI's shared-memory
// transport: the large calls use the rendezvous protocol, where blocking sends can deadlock.
const size_t kSizes[] = {1, 7, 4099};
const size_t kLargeP2P = 262144;  // 1 MB in fp32

void test_axis(Ctx& ctx, Comm& c, Axis a, const std::vector<Coord>& table, const Layout& L,
               const std::string& layout) {
  ctx.where = layout + " axis " + axis_name(a);
  const std::vector<int> M = expected_members(table, L, a, ctx.world_rank);
  check(ctx, c.axis == a && c.size == (int)M.size(), "axis and group size");
  check(ctx, actual_members(c) == M, "group members (world ranks in group order)");
  check(ctx, c.rank < (int)M.size() && M[c.rank] == ctx.world_rank, "rank within the group");
  // With wrong groups the collectives below would only repeat the failure, or hang: stop here
  // if any rank saw one (all ranks decide together, so none is left waiting).
  int ok = ctx.failures == 0, all_ok = 0;
  MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
  if (!all_ok) return;
  for (DType dt : {DType::F32, DType::BF16}) {
    ctx.where = layout + " axis " + axis_name(a) + " " + dtype_name(dt);
    for (size_t n : kSizes) {
      test_all_reduce(ctx, c, M, n, dt, true);
      test_reduce_scatter(ctx, c, M, n, dt, true, false);
      test_reduce_scatter(ctx, c, M, n, dt, true, true);
      test_all_gather(ctx, c, M, n, dt, false);
      test_all_gather(ctx, c, M, n, dt, true);
      test_broadcast(ctx, c, M, n, dt, 0);
      test_broadcast(ctx, c, M, n, dt, c.size - 1);
      test_ring(ctx, c, M, n, dt);
      test_pair_ring(ctx, c, M, n, dt);
      test_pipeline_exchange(ctx, c, M, n, dt);
      test_chain(ctx, c, M, n, dt);
      test_batch_both_ways(ctx, c, M, n, dt);
      test_tags(ctx, c, M, n, dt);
      test_all_to_all(ctx, c, M, n, dt);
      test_all_to_all_v(ctx, c, M, n, dt);
      if (c.size == 2) {  // one rounding per sum: general values
        test_all_reduce(ctx, c, M, n, dt, false);
        test_reduce_scatter(ctx, c, M, n, dt, false, false);
      }
    }
  }
  // The integer payloads of the compressed reductions (int8 codes, int32 indices): every
  // collective that moves data without summing it.
  for (DType dt : {DType::I8, DType::I32}) {
    ctx.where = layout + " axis " + axis_name(a) + " " + dtype_name(dt);
    for (size_t n : kSizes) {
      test_all_gather(ctx, c, M, n, dt, false);
      test_all_gather(ctx, c, M, n, dt, true);
      test_broadcast(ctx, c, M, n, dt, c.size - 1);
      test_pair_ring(ctx, c, M, n, dt);
      test_all_to_all(ctx, c, M, n, dt);
      test_all_to_all_v(ctx, c, M, n, dt);
    }
  }
  // 1 MB messages (fp32), far past every eager limit: a blocking send in send_recv would hang
  // here. On the pipeline axis only (the one that will use them; every world size has a layout
  // with pp = world), to keep the suite fast.
  if (a == Axis::PP && c.size > 1) {
    ctx.where = layout + " axis " + axis_name(a) + " fp32 1 MB";
    test_pair_ring(ctx, c, M, kLargeP2P, DType::F32);
    test_pipeline_exchange(ctx, c, M, kLargeP2P, DType::F32);
    test_batch_both_ways(ctx, c, M, kLargeP2P, DType::F32);
    test_tags(ctx, c, M, kLargeP2P, DType::F32);
  }
  barrier(c);
  expect_call(ctx, c, CollectiveKind::Barrier, 0);
  test_host_helpers(ctx, c, M);
}

// ---------------------------------------------------------------------------------------------
// Layouts
// ---------------------------------------------------------------------------------------------
// n_layer 12: every pp of the layouts tested (1 to 4) gets equal stages.
Config make_config(const Layout& L, int n_head = 12, int seq_len = 48, int n_layer = 12) {
  Config cfg;
  cfg.parallel.dp = L.dp, cfg.parallel.tp = L.tp, cfg.parallel.pp = L.pp;
  cfg.parallel.cp = L.cp, cfg.parallel.ep = L.ep;
  cfg.model.n_head = n_head, cfg.model.seq_len = seq_len, cfg.model.n_layer = n_layer;
  return cfg;
}

std::string describe(const Layout& L) {
  char buf[96];
  std::snprintf(buf, sizeof(buf), "dp=%d tp=%d pp=%d cp=%d ep=%d", L.dp, L.tp, L.pp, L.cp, L.ep);
  return buf;
}

// Every (dp, pp, cp, tp) with product `world`, and every ep dividing dp*cp.
std::vector<Layout> layouts_for(int world) {
  std::vector<Layout> out;
  for (int dp = 1; dp <= world; ++dp)
    for (int pp = 1; pp <= world; ++pp)
      for (int cp = 1; cp <= world; ++cp)
        for (int tp = 1; tp <= world; ++tp)
          if (dp * pp * cp * tp == world)
            for (int ep = 1; ep <= dp * cp; ++ep)
              if (dp * cp % ep == 0) out.push_back({dp, tp, pp, cp, ep});
  return out;
}

void check_coordinates(Ctx& ctx, const Mesh& mesh, const Layout& L) {
  const Coord c = coordinates(L)[ctx.world_rank];
  const MeshCoords pure = mesh_coords(mesh.shape, ctx.world_rank);
  check(ctx, mesh[Axis::DP].rank == c.dp && mesh[Axis::PP].rank == c.pp &&
                 mesh[Axis::CP].rank == c.cp && mesh[Axis::TP].rank == c.tp &&
                 mesh[Axis::EP].rank == c.ep,
        "coordinates (group ranks)");
  check(ctx, pure.dp == c.dp && pure.pp == c.pp && pure.cp == c.cp && pure.tp == c.tp &&
                 pure.ep == c.ep && mesh_world_rank(mesh.shape, pure) == ctx.world_rank,
        "coordinates (mesh_coords, mesh_world_rank)");
  check(ctx, mesh.shape.dp == L.dp && mesh.shape.tp == L.tp && mesh.shape.pp == L.pp &&
                 mesh.shape.cp == L.cp && mesh.shape.ep == L.ep &&
                 mesh.shape.world() == ctx.world_size && mesh.world_rank == ctx.world_rank,
        "degrees and world");
}

void check_counters(Ctx& ctx, const Mesh& mesh) {
  for (int a = 0; a < (int)Axis::Count; ++a)
    for (int k = 0; k < (int)CollectiveKind::Count; ++k) {
      const CommCounters& got = mesh.stats.axis[a];
      const CommCounters& want = ctx.expected.axis[a];
      char what[160];
      std::snprintf(what, sizeof(what), "counters of axis %s kind %d: %llu calls %llu bytes, "
                    "want %llu calls %llu bytes", axis_name((Axis)a), k,
                    (unsigned long long)got.calls[k], (unsigned long long)got.bytes[k],
                    (unsigned long long)want.calls[k], (unsigned long long)want.bytes[k]);
      check(ctx, got.calls[k] == want.calls[k] && got.bytes[k] == want.bytes[k], what);
    }
}

// After a reset, 3 all-reduces of 1 MB, one all-gather of 1 MB / world_size per rank and a
// barrier on the world axis over 2 steps must print exactly these numbers (nothing on one rank).
void check_summary(Ctx& ctx, Mesh& mesh) {
  ctx.where = "summary";
  comm_stats_reset(mesh.stats);
  const size_t n = 250000;  // fp32: 1 MB
  void* buf = upload(std::vector<float>(n, 1.0f), DType::F32);
  void* gathered = poisoned(n, DType::F32);
  for (int i = 0; i < 3; ++i) all_reduce_sum(mesh[Axis::World], buf, n, DType::F32, nullptr);
  const size_t per_rank = n / ctx.world_size;
  all_gather(mesh[Axis::World], buf, gathered, per_rank, DType::F32, nullptr);
  barrier(mesh[Axis::World]);
  char* text = nullptr;
  size_t len = 0;
  FILE* f = open_memstream(&text, &len);
  comm_stats_print(mesh.stats, 2, f);
  std::fclose(f);
  const int W = ctx.world_size;
  char want[512] = "";
  const double gathered_mb = W * per_rank * 4 / 1e6 / 2;
  if (W > 1)
    std::snprintf(want, sizeof(want),
                  "comm world (n=%d): all-reduce 1.5 calls/step 1.50 MB/step (wire %.2f MB/rank); "
                  "all-gather 0.5 calls/step %.2f MB/step (wire %.2f MB/rank); "
                  "barrier 0.5 calls/step\n",
                  W, 1.5 * 2 * (W - 1) / W, gathered_mb, gathered_mb * (W - 1) / W);
  check(ctx, std::string(text) == want,
        std::string("printed summary:\n") + text + "want:\n" + want);
  std::free(text);
  ops::release(buf);
  ops::release(gathered);
}

void run_layout(Ctx& ctx, const Layout& L) {
  const std::string name = describe(L);
  Mesh mesh;
  mesh_init(mesh, mesh_shape(make_config(L)), ctx.world_rank, 0, ctx.backend);
  ctx.where = name;
  ctx.expected = CommStats{};
  check_coordinates(ctx, mesh, L);
  const std::vector<Coord> table = coordinates(L);
  const std::pair<Comm*, Axis> axes[] = {
      {&mesh[Axis::World], Axis::World}, {&mesh[Axis::DP], Axis::DP},
      {&mesh[Axis::TP], Axis::TP},       {&mesh[Axis::PP], Axis::PP},
      {&mesh[Axis::CP], Axis::CP},       {&mesh[Axis::DPCP], Axis::DPCP},
      {&mesh[Axis::EP], Axis::EP},       {&mesh[Axis::EPDP], Axis::EPDP},
      {&mesh[Axis::Stage], Axis::Stage}, {&mesh[Axis::Embed], Axis::Embed}};
  for (const auto& [comm, axis] : axes) {
    test_axis(ctx, *comm, axis, table, L, name);
    check(ctx, mesh.stats.group_size[(int)axis] == comm->size, "group size in the stats");
  }
  ctx.where = name;
  check_counters(ctx, mesh);
  check_summary(ctx, mesh);
  mesh_destroy(mesh);
}

// ---------------------------------------------------------------------------------------------
// The Count backend (the planner's)
// ---------------------------------------------------------------------------------------------
// Every collective once on group c (2+ ranks), each buffer filled with a byte pattern that must
// survive: Count counts like the real backends (comm.h's payload rules) and moves nothing. Returns
// the counters expected.
CommCounters count_collectives(Ctx& ctx, Comm& c) {
  const int n = c.size, next = (c.rank + 1) % n, prev = (c.rank + n - 1) % n;
  std::vector<char> a(4096, 0x5a), b(4096, 0x3c);
  const std::vector<char> a0 = a, b0 = b;
  std::vector<size_t> counts(n), back(n);
  for (int j = 0; j < n; j++) counts[j] = j + 1, back[j] = 2;
  all_reduce_sum(c, a.data(), 7, DType::F32, nullptr);
  all_reduce_max(c, (float*)a.data(), 3, nullptr);
  reduce_scatter_sum(c, a.data(), b.data(), 5, DType::BF16, nullptr);
  all_gather(c, a.data(), b.data(), 3, DType::F32, nullptr);
  broadcast(c, a.data(), 9, DType::BF16, n - 1, nullptr);
  send_recv(c, a.data(), 4, next, b.data(), 6, prev, DType::F32, nullptr);
  all_to_all(c, a.data(), b.data(), 2, DType::F32, nullptr);
  all_to_all_v(c, a.data(), counts.data(), b.data(), back.data(), DType::BF16, nullptr);
  barrier(c);
  check(ctx, a == a0 && b == b0, "count: the buffers are untouched");
  CommCounters want{};
  auto add = [&](CollectiveKind k, uint64_t bytes) {
    want.calls[(int)k]++;
    want.bytes[(int)k] += bytes;
  };
  add(CollectiveKind::AllReduce, 28);
  add(CollectiveKind::AllReduce, 12);
  add(CollectiveKind::ReduceScatter, (uint64_t)n * 5 * 2);
  add(CollectiveKind::AllGather, (uint64_t)n * 3 * 4);
  add(CollectiveKind::Broadcast, 18);
  add(CollectiveKind::Send, 16);
  add(CollectiveKind::Recv, 24);
  add(CollectiveKind::AllToAll, (uint64_t)n * 2 * 4);
  add(CollectiveKind::AllToAll, (uint64_t)n * (n + 1) / 2 * 2);
  add(CollectiveKind::Barrier, 0);
  return want;
}

// The host helpers answer as if every rank of the group were this one.
void count_host_helpers(Ctx& ctx, Comm& c, CommCounters& want) {
  const int n = c.size, per = 3;
  std::vector<int> send(n * per), recv(n * per, -1);
  for (int i = 0; i < n * per; i++) send[i] = 100 * c.rank + i;
  all_to_all_host(c, send.data(), per, recv.data());
  bool mine = true;
  for (int j = 0; j < n; j++)
    for (int i = 0; i < per; i++) mine &= recv[j * per + i] == send[c.rank * per + i];
  check(ctx, mine, "count: all_to_all_host gives back this rank's own block from everyone");
  int x[2] = {3, -4};
  all_reduce_host_sum(c, x, 2);
  check(ctx, x[0] == 3 * n && x[1] == -4 * n, "count: all_reduce_host_sum (int) is size times x");
  want.calls[(int)CollectiveKind::AllToAll]++;
  want.bytes[(int)CollectiveKind::AllToAll] += (uint64_t)n * per * 4;
  want.calls[(int)CollectiveKind::AllReduce]++;
  want.bytes[(int)CollectiveKind::AllReduce] += 8;
  check(ctx, all_reduce_host_sum(c, 1.5) == 1.5 * n && all_reduce_host_max(c, 2.5) == 2.5 &&
                 !all_agree(c, false) && all_agree(c, true),
        "count: the uncounted helpers");
  std::vector<double> g(n, 0.0);
  const double v = 7.25;
  all_gather_host(c, &v, sizeof(v), g.data());
  const std::vector<std::string> all = all_gather_strings(c, "rank");
  check(ctx, g == std::vector<double>(n, v) && all == std::vector<std::string>(n, "rank"),
        "count: the gathers replicate this rank's value");
}

// For every layout of 8 ranks and each of its ranks, described with the Count backend: the
// groups are those of the documented formula, and each group's calls are counted exactly.
int run_count(Ctx& ctx) {
  for (const Layout& L : layouts_for(8)) {
    const std::vector<Coord> table = coordinates(L);
    for (int w = 0; w < 8; w++) {
      ctx.where = "count " + describe(L) + " rank " + std::to_string(w);
      Mesh mesh;
      mesh_init(mesh, mesh_shape(make_config(L)), w, 0, CommBackend::Count);
      for (int a = 0; a < (int)Axis::Count; a++) {
        Comm& c = mesh.groups[a];
        const std::vector<int> M = expected_members(table, L, (Axis)a, w);
        check(ctx, c.size == (int)M.size() && M[c.rank] == w, "count: group of the formula");
        if (c.size == 1 || c.size != (int)M.size()) continue;
        CommCounters want = count_collectives(ctx, c);
        count_host_helpers(ctx, c, want);
        const CommCounters& got = mesh.stats.axis[a];
        check(ctx, std::memcmp(&got, &want, sizeof(want)) == 0,
              std::string("count: the counters of axis ") + axis_name((Axis)a));
      }
      mesh_destroy(mesh);
    }
  }
  std::printf("test_comm count: %ld checks, %ld failures\n", ctx.checks, ctx.failures);
  return ctx.failures == 0 ? 0 : 1;
}

// ---------------------------------------------------------------------------------------------
// Modes
// ---------------------------------------------------------------------------------------------
int run_all(Ctx& ctx) {
  const char* env = std::getenv("COMM_TEST_SEED");
  ctx.seed = env ? std::strtoull(env, nullptr, 10) : std::random_device{}();
  const char* backend = std::getenv("COMM_TEST_BACKEND");
  if (backend && std::string(backend) == "nccl") ctx.backend = CommBackend::NCCL;
  MPI_Bcast(&ctx.seed, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  const std::vector<Layout> layouts = layouts_for(ctx.world_size);
  for (const Layout& L : layouts) run_layout(ctx, L);
  long failures = 0, checks = 0;
  MPI_Allreduce(&ctx.failures, &failures, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
  MPI_Allreduce(&ctx.checks, &checks, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
  if (ctx.world_rank == 0)
    std::printf("test_comm (%s): %d ranks, %zu layouts, %ld checks, %ld failures "
                "(COMM_TEST_SEED=%llu)\n",
                ctx.backend == CommBackend::NCCL  ? "nccl"
                : ops::device_memory_is_host()    ? "mpi, host buffers"
                                                  : "mpi, fake device, staged",
                ctx.world_size, layouts.size(), checks, failures, (unsigned long long)ctx.seed);
  return failures == 0 ? 0 : 1;
}

int run_validate(int argc, char** argv) {
  CHECK(argc == 11, "usage: test_comm validate W dp tp pp cp ep n_head seq_len n_layer");
  int v[9];
  for (int i = 0; i < 9; ++i) v[i] = std::atoi(argv[2 + i]);
  const Config cfg = make_config({v[1], v[2], v[3], v[4], v[5]}, v[6], v[7], v[8]);
  const std::string msg = layout_problems(cfg, v[0]);
  std::printf("%s\n", msg.empty() ? "ok" : msg.c_str());
  return 0;
}

int run_layout_only(const Ctx& ctx, int argc, char** argv) {
  CHECK(argc == 7 || argc == 8, "usage: test_comm layout dp tp pp cp ep [nccl]");
  const Layout L = {std::atoi(argv[2]), std::atoi(argv[3]), std::atoi(argv[4]),
                    std::atoi(argv[5]), std::atoi(argv[6])};
  const CommBackend backend = argc == 8 ? CommBackend::NCCL : CommBackend::MPI;
  Mesh mesh;
  mesh_init(mesh, mesh_shape(make_config(L)), ctx.world_rank, 0, backend);
  if (ctx.world_rank == 0) std::printf("ok\n");
  mesh_destroy(mesh);
  return 0;
}

// Rank 1 fails while every other rank waits in an all-reduce over the world.
int run_failure(const Ctx& ctx, const std::string& mode) {
  CHECK(ctx.world_size >= 2, "test_comm %s needs at least 2 ranks", mode.c_str());
  Mesh mesh;
  mesh_init(mesh, mesh_shape(make_config({ctx.world_size, 1, 1, 1, 1})), ctx.world_rank,
            0, CommBackend::MPI);
  void* buf = upload({1.0f}, DType::F32);
  all_reduce_sum(mesh[Axis::World], buf, 1, DType::F32, nullptr);  // everyone is up
  if (ctx.world_rank == 1) {
    if (mode == "fatal") FATAL("deliberate failure of rank 1 (test_comm fatal)");
    if (mode == "throw")
      throw std::runtime_error("deliberate exception of rank 1 (test_comm throw)");
    raise(SIGKILL);
  }
  all_reduce_sum(mesh[Axis::World], buf, 1, DType::F32, nullptr);  // never completes
  std::fprintf(stderr, "[rank %d] the job survived the failure of rank 1\n", ctx.world_rank);
  return 3;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "all";
  if (mode == "validate") return run_validate(argc, argv);  // no MPI needed
  Ctx ctx;
  int local_rank = 0;
  runtime_init(&argc, &argv, &ctx.world_rank, &ctx.world_size, &local_rank);
#ifndef COMM_TEST_FAKE_DEVICE
  ops::device_init(local_rank);
#endif
  int rc = 2;
  if (mode == "all") rc = run_all(ctx);
  else if (mode == "layout") rc = run_layout_only(ctx, argc, argv);
  else if (mode == "count") rc = run_count(ctx);
  else if (mode == "fatal" || mode == "throw" || mode == "hang") rc = run_failure(ctx, mode);
  else if (ctx.world_rank == 0) std::fprintf(stderr, "test_comm: unknown mode %s\n", mode.c_str());
  runtime_finalize();
  return rc;
}
