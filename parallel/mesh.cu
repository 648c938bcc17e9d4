// parallel/mesh.cu - MPI start-up and shutdown, and the device mesh: each rank's coordinates and one communicator per axis (layout in mesh.h).
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
// Groups are made with MPI_Comm_split over MPI_COMM_WORLD: ranks with equal "color" form a group,
// ordered by "key". The color of an axis is the rank's coordinates on every other axis, the key
// its coordinate on this one. Every axis is built, even those no parallelism uses yet.
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "parallel/mesh.h"

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

// Splits MPI_COMM_WORLD by color, orders by key, and makes this rank's group a Comm.
void make_comm(Comm& c, Axis axis, int color, int key, CommBackend backend, CommStats* stats) {
  MPI_Comm group;
  MPI_Comm_split(MPI_COMM_WORLD, color, key, &group);
  comm_create(c, axis, group, backend, stats);
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
// The mesh
// ---------------------------------------------------------------------------------------------
// The stats pointers of the comms point into `mesh`: a Mesh must stay where mesh_init built it.
void mesh_init(Mesh& mesh, const Config& cfg, int world_rank, int world_size, int local_rank,
               CommBackend backend) {
  const ParallelConfig& p = cfg.parallel;
  CHECK(p.dp * p.pp * p.cp * p.tp == world_size, "mesh: dp*pp*cp*tp = %d*%d*%d*%d for %d ranks "
        "(the config check, config/layout_rules.cu, should have refused it)", p.dp, p.pp, p.cp,
        p.tp, world_size);
  if (backend == CommBackend::NCCL) comm_nccl::require();

  mesh.world_size = world_size;
  mesh.world_rank = world_rank;
  mesh.local_rank = local_rank;
  mesh.dp = cfg.parallel.dp, mesh.tp = cfg.parallel.tp, mesh.pp = cfg.parallel.pp;
  mesh.cp = cfg.parallel.cp, mesh.ep = cfg.parallel.ep;
  mesh.stats = CommStats{};

  // world_rank = ((dp_rank * pp + pp_rank) * cp + cp_rank) * tp + tp_rank
  const int tp = mesh.tp, cp = mesh.cp, pp = mesh.pp;
  const int tp_rank = world_rank % tp;
  const int cp_rank = world_rank / tp % cp;
  const int pp_rank = world_rank / (tp * cp) % pp;
  const int dp_rank = world_rank / (tp * cp * pp);
  // dp x cp, numbered dp-major, cut into consecutive blocks of ep ranks.
  const int dpcp_index = dp_rank * cp + cp_rank;
  const int ep_block = dpcp_index / mesh.ep;
  const int ep_rank = dpcp_index % mesh.ep;
  const int n_ep_blocks = mesh.dp * cp / mesh.ep;
  const int pp_tp = pp_rank * tp + tp_rank;  // the coordinates outside dp x cp
  mesh.dp_rank = dp_rank, mesh.tp_rank = tp_rank, mesh.pp_rank = pp_rank;
  mesh.cp_rank = cp_rank, mesh.ep_rank = ep_rank;

  // Colors: a rank's coordinates on the axes other than the group's own.
  const int dp_color = (pp_rank * cp + cp_rank) * tp + tp_rank;
  const int tp_color = world_rank / tp;
  const int pp_color = (dp_rank * cp + cp_rank) * tp + tp_rank;
  const int cp_color = (dp_rank * pp + pp_rank) * tp + tp_rank;
  const int ep_color = pp_tp * n_ep_blocks + ep_block;
  const int epdp_color = pp_tp * mesh.ep + ep_rank;
  CommStats* st = &mesh.stats;
  make_comm(mesh.world, Axis::World, 0, world_rank, backend, st);
  make_comm(mesh.dp_comm, Axis::DP, dp_color, dp_rank, backend, st);
  make_comm(mesh.tp_comm, Axis::TP, tp_color, tp_rank, backend, st);
  make_comm(mesh.pp_comm, Axis::PP, pp_color, pp_rank, backend, st);
  make_comm(mesh.cp_comm, Axis::CP, cp_color, cp_rank, backend, st);
  make_comm(mesh.dpcp_comm, Axis::DPCP, pp_tp, dpcp_index, backend, st);
  make_comm(mesh.ep_comm, Axis::EP, ep_color, ep_rank, backend, st);
  make_comm(mesh.epdp_comm, Axis::EPDP, epdp_color, ep_block, backend, st);
  make_comm(mesh.stage_comm, Axis::Stage, pp_rank, world_rank, backend, st);
  // The embedding group: pipeline ranks 0 and pp-1 of one pipeline (a middle stage: alone).
  const bool ends = pp_rank == 0 || pp_rank == pp - 1;
  make_comm(mesh.embed_comm, Axis::Embed, ends ? pp_color : world_size + world_rank, pp_rank,
            backend, st);
}

void mesh_destroy(Mesh& mesh) {
  for (Comm* c : {&mesh.world, &mesh.dp_comm, &mesh.tp_comm, &mesh.pp_comm, &mesh.cp_comm,
                  &mesh.dpcp_comm, &mesh.ep_comm, &mesh.epdp_comm, &mesh.stage_comm,
                  &mesh.embed_comm})
    comm_destroy(*c);
  mesh.stats = CommStats{};
}

CommsByAxis mesh_comms(Mesh& mesh) {
  CommsByAxis c;
  c.axis[(int)Axis::World] = &mesh.world;
  c.axis[(int)Axis::DP] = &mesh.dp_comm;
  c.axis[(int)Axis::TP] = &mesh.tp_comm;
  c.axis[(int)Axis::PP] = &mesh.pp_comm;
  c.axis[(int)Axis::CP] = &mesh.cp_comm;
  c.axis[(int)Axis::EP] = &mesh.ep_comm;
  c.axis[(int)Axis::DPCP] = &mesh.dpcp_comm;
  c.axis[(int)Axis::EPDP] = &mesh.epdp_comm;
  c.axis[(int)Axis::Stage] = &mesh.stage_comm;
  c.axis[(int)Axis::Embed] = &mesh.embed_comm;
  return c;
}
