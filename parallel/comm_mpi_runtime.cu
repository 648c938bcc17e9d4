// parallel/comm_mpi_runtime.cu - the MPI backend's process side: start-up and shutdown, the
// handling of a failing rank, the groups (MPI communicators, and NCCL ones on top), and the host
// side of the helpers in comm.h. With parallel/comm_mpi.cu (the collectives) this is the only
// code that calls MPI.
//
// Waiting: every MPI call of the backend is nonblocking and waited for by mpi_wait, which sleeps
// instead of spinning and ends the job past [parallel] timeout_s (parallel/watchdog.h).
//
// Failure handling: one failing rank must end the whole job, naming itself. runtime_init installs
//   - the FATAL hook (kernels/common.h): prefix "[rank r] " on every message, then
//     MPI_Abort(MPI_COMM_WORLD), which makes mpirun kill every other rank (a one-rank job just
//     leaves MPI and exits: there is no one to kill, and no abort banner to print);
//   - the FATAL_ALL hook, for errors every rank finds alike (config, layout, files): rank 0
//     prints, every rank calls MPI_Finalize and exits with status 1;
//   - a std::terminate handler: an uncaught C++ exception goes through FATAL the same way;
//   - an MPI error handler on MPI_COMM_WORLD (inherited by every group split from it): an MPI
//     error is reported through FATAL with MPI's own text.
// A rank killed by a signal is mpirun's business: it notices the lost process and ends the job.
//
// Groups: MPI_Comm_split over MPI_COMM_WORLD, where ranks with equal "color" form a group ordered
// by "key": the color of a group is its first member's world rank (unique to it), the key the
// rank's place in the member list (parallel/mesh.cu works the lists out).
//
// Threads: runtime_init gathers the affinity masks of the node's ranks (sizeof(cpu_set_t) bytes
// each, over the node's communicator) and sets this rank's OpenMP threads to its share of its
// cores (parallel/host_threads.h), so no launcher oversubscribes them.
#include <omp.h>
#include <sched.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "parallel/comm_mpi_internal.h"
#include "parallel/host_threads.h"

namespace {

// Leaves MPI cleanly (FATAL_ALL on every rank, or FATAL in a one-rank job).
void finish_job() {
  set_fatal_handler(nullptr, "");
  set_shared_error_handler(nullptr, true);
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

[[noreturn]] void abort_job(int exit_code) {
  int world_size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  if (world_size == 1) {
    finish_job();
    std::exit(exit_code);
  }
  MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::_Exit(exit_code);  // MPI_Abort does not return; this is for the compiler
}

void on_mpi_error(MPI_Comm*, int* error_code, ...) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(*error_code, text, &len);
  FATAL("MPI: %s", text);
}

[[noreturn]] void on_terminate() {
  std::string what = "std::terminate called without an exception";
  if (std::exception_ptr e = std::current_exception()) {
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& x) {
      what = std::string("uncaught exception: ") + x.what();
    } catch (...) {
      what = "uncaught exception of a non-standard type";
    }
  }
  FATAL("%s", what.c_str());
}

// This rank's OpenMP threads: its share of the cores of its affinity mask among the ranks of its
// node (`node`: their communicator), or OMP_NUM_THREADS (parallel/host_threads.h).
void choose_host_threads(MPI_Comm node) {
  int node_rank = 0, node_size = 1;
  MPI_Comm_rank(node, &node_rank);
  MPI_Comm_size(node, &node_size);
  cpu_set_t mine;
  CPU_ZERO(&mine);
  if (sched_getaffinity(0, sizeof(mine), &mine) != 0)
    for (int cpu = 0; cpu < omp_get_num_procs() && cpu < CPU_SETSIZE; cpu++) CPU_SET(cpu, &mine);
  std::vector<cpu_set_t> all(node_size);
  MPI_Allgather(&mine, sizeof(mine), MPI_BYTE, all.data(), sizeof(mine), MPI_BYTE, node);
  std::vector<std::vector<int>> masks(node_size);
  for (int r = 0; r < node_size; r++)
    for (int cpu = 0; cpu < CPU_SETSIZE; cpu++)
      if (CPU_ISSET(cpu, &all[r])) masks[r].push_back(cpu);
  const HostThreads chosen = host_threads_choose(masks, node_rank, std::getenv("OMP_NUM_THREADS"));
  if (!std::getenv("OMP_NUM_THREADS")) omp_set_num_threads(chosen.threads);
  host_threads_set(chosen);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Start-up and shutdown
// ---------------------------------------------------------------------------------------------
void runtime_init(int* argc, char*** argv, int* world_rank, int* world_size, int* local_rank) {
  int provided = 0;
  MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, world_size);

  // A one-rank run keeps plain "error: ..." messages; with several ranks each names its rank.
  char prefix[32] = "";
  if (*world_size > 1) std::snprintf(prefix, sizeof(prefix), "[rank %d] ", *world_rank);
  set_fatal_handler(abort_job, prefix);
  set_shared_error_handler(finish_job, *world_rank == 0);
  std::set_terminate(on_terminate);
  MPI_Errhandler handler;
  MPI_Comm_create_errhandler(on_mpi_error, &handler);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, handler);
  MPI_Errhandler_free(&handler);  // the communicator keeps its own reference

  CHECK(provided >= MPI_THREAD_FUNNELED,
        "MPI provides thread level %d, the trainer needs MPI_THREAD_FUNNELED", provided);
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, *world_rank, MPI_INFO_NULL, &node);
  MPI_Comm_rank(node, local_rank);
  choose_host_threads(node);
  MPI_Comm_free(&node);
}

void runtime_finalize() {
  set_fatal_handler(nullptr, "");  // MPI_Abort is no longer available
  set_shared_error_handler(nullptr, true);
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Finalize();
}

// ---------------------------------------------------------------------------------------------
// Groups
// ---------------------------------------------------------------------------------------------
void comm_create(Comm& c, Axis axis, const std::vector<int>& members, int world_rank,
                 CommBackend backend, CommStats* stats, Watchdog* watch) {
  c = Comm{};
  c.axis = axis;
  c.backend = backend;
  c.stats = stats;
  c.watch = watch;
  c.size = (int)members.size();
  c.rank = -1;
  for (int i = 0; i < c.size; i++)
    if (members[i] == world_rank) c.rank = i;
  CHECK(c.size > 0 && c.rank >= 0, "axis %s: world rank %d is not a member of its group",
        axis_name(axis), world_rank);
  if (stats) stats->group_size[(int)axis] = c.size;
  if (backend != CommBackend::MPI && backend != CommBackend::NCCL) return;  // a description
  MPI_Comm* group = new MPI_Comm;
  MPI_Comm_split(MPI_COMM_WORLD, members[0], c.rank, group);
  c.mpi = group;
  int rank = -1, size = 0;
  MPI_Comm_rank(*group, &rank);
  MPI_Comm_size(*group, &size);
  CHECK(rank == c.rank && size == c.size, "axis %s: MPI made rank %d of %d, the mesh expects %d "
        "of %d", axis_name(axis), rank, size, c.rank, c.size);
  // One-rank groups never reach a backend, so they need no NCCL communicator.
  if (backend == CommBackend::NCCL && c.size > 1) c.nccl = nccl_create(c);
}

void comm_open_tags(Comm& c, int tags) {
  if (tags <= c.tags) return;
  if (c.nccl)  // a communicator per tag, made like the group's own (every member calls this)
    while ((int)c.nccl_tags.size() < tags - 1) c.nccl_tags.push_back(nccl_create(c));
  c.tags = tags;
}

void comm_destroy(Comm& c) {
  for (void* t : c.nccl_tags) nccl_destroy(c, t);
  c.nccl_tags.clear();
  if (c.nccl) nccl_destroy(c, c.nccl);
  if (c.mpi) {
    MPI_Comm* group = static_cast<MPI_Comm*>(c.mpi);
    MPI_Comm_free(group);
    delete group;
  }
  std::free(c.staging);
  c = Comm{};
}

// ---------------------------------------------------------------------------------------------
// Waiting, with a deadline
// ---------------------------------------------------------------------------------------------
namespace {

// A wait first yields the core between tests for up to kYieldS (a collective whose peers are
// already there completes within it), then sleeps, 20 us growing to 1 ms: a long wait (a slow
// peer, a stopped one) costs no CPU.
constexpr double kYieldS = 1e-3;
constexpr long kFirstNapNs = 20000, kLongestNapNs = 1000000;

void nap(long ns) {
  struct timespec t = {0, ns};
  nanosleep(&t, nullptr);
}

[[noreturn]] void deadline_passed(const Comm& c, const char* op, double waited) {
  const Watchdog& w = *c.watch;
  FATAL("watchdog: %s on axis %s (%d ranks) at step %lld has waited %.1f s, longer than "
        "[parallel] timeout_s = %g: another rank of the group stopped, died or is far behind",
        op, axis_name(c.axis), c.size, (long long)w.step, waited, w.timeout_s);
}

}  // namespace

void mpi_wait(Comm& c, int n, MPI_Request* requests, MPI_Status* statuses, const char* op) {
  const auto start = std::chrono::steady_clock::now();
  const double timeout = c.watch ? c.watch->timeout_s : 0;
  long nap_ns = kFirstNapNs;
  for (;;) {
    int done = 0;
    MPI_Testall(n, requests, &done, statuses);
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (done) {
      if (c.watch) c.watch->waited_s += waited;
      return;
    }
    if (timeout > 0 && waited > timeout) deadline_passed(c, op, waited);
    if (waited < kYieldS) {
      sched_yield();
      continue;
    }
    nap(nap_ns);
    nap_ns = std::min(2 * nap_ns, kLongestNapNs);
  }
}

// ---------------------------------------------------------------------------------------------
// The host side
// ---------------------------------------------------------------------------------------------
namespace {

MPI_Datatype host_type(HostType t) {
  return t == HostType::Int ? MPI_INT : t == HostType::Double ? MPI_DOUBLE : MPI_BYTE;
}

MPI_Op host_op(HostOp op) {
  return op == HostOp::Sum ? MPI_SUM : op == HostOp::Max ? MPI_MAX : MPI_LAND;
}

}  // namespace

namespace mpi_host {

void barrier(Comm& c) {
  MPI_Request r;
  MPI_Ibarrier(mpi_group(c), &r);
  mpi_wait(c, 1, &r, MPI_STATUSES_IGNORE, "barrier");
}

void all_reduce(Comm& c, void* x, int n, HostType t, HostOp op) {
  MPI_Request r;
  MPI_Iallreduce(MPI_IN_PLACE, x, n, host_type(t), host_op(op), mpi_group(c), &r);
  mpi_wait(c, 1, &r, MPI_STATUSES_IGNORE, "host all-reduce");
}

void all_to_all(Comm& c, const void* send, int per_peer, void* recv, HostType t) {
  MPI_Request r;
  MPI_Ialltoall(send, per_peer, host_type(t), recv, per_peer, host_type(t), mpi_group(c), &r);
  mpi_wait(c, 1, &r, MPI_STATUSES_IGNORE, "host all-to-all");
}

void broadcast(Comm& c, void* buf, size_t bytes, int root) {
  MPI_Request r;
  MPI_Ibcast(buf, (int)bytes, MPI_BYTE, root, mpi_group(c), &r);
  mpi_wait(c, 1, &r, MPI_STATUSES_IGNORE, "host broadcast");
}

void all_gather(Comm& c, const void* mine, size_t bytes, void* all) {
  MPI_Request r;
  MPI_Iallgather(mine, (int)bytes, MPI_BYTE, all, (int)bytes, MPI_BYTE, mpi_group(c), &r);
  mpi_wait(c, 1, &r, MPI_STATUSES_IGNORE, "host all-gather");
}

void all_gather_v(Comm& c, const void* mine, int bytes, const int* all_bytes, void* all) {
  std::vector<int> displs(c.size, 0);
  for (int r = 1; r < c.size; r++) displs[r] = displs[r - 1] + all_bytes[r - 1];
  MPI_Request r;
  MPI_Iallgatherv(mine, bytes, MPI_BYTE, all, all_bytes, displs.data(), MPI_BYTE, mpi_group(c),
                  &r);
  mpi_wait(c, 1, &r, MPI_STATUSES_IGNORE, "host all-gather");
}

}  // namespace mpi_host
