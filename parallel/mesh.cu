// parallel/mesh.cu - MPI start-up and shutdown, the validation of the parallel degrees, and the
// device mesh: each rank's coordinates and one communicator per axis (layout in mesh.h).
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
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "parallel/mesh.h"
#include "parallel/pipeline_schedule.h"

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

std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string format(const char* fmt, ...) {
  char buf[512];
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(buf, sizeof(buf), fmt, args);
  va_end(args);
  return buf;
}

// Splits MPI_COMM_WORLD by color, orders by key, and makes this rank's group a Comm.
void make_comm(Comm& c, Axis axis, int color, int key, CommBackend backend, CommStats* stats) {
  MPI_Comm group;
  MPI_Comm_split(MPI_COMM_WORLD, color, key, &group);
  comm_create(c, axis, group, backend, stats);
}

// Every rank reaches the same verdict: rank 0 reports it once and every rank exits cleanly.
[[noreturn]] void stop_invalid_layout(const std::string& message) {
  FATAL_ALL("%s", message.c_str());
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
// Validation: every rule that ties the degrees to the model or the world size, checked before
// any work. All violated rules are reported, one per line, each naming the degrees and the rule.
// ---------------------------------------------------------------------------------------------
std::string mesh_validate(const Config& cfg, int world_size) {
  const ParallelConfig& p = cfg.parallel;
  const ModelConfig& m = cfg.model;
  const struct { const char* key; int value; } degrees[] = {
      {"dp", p.dp}, {"tp", p.tp}, {"pp", p.pp}, {"cp", p.cp}, {"ep", p.ep}};
  for (const auto& d : degrees)
    if (d.value < 1) return format("[parallel] %s = %d must be at least 1", d.key, d.value);

  std::string errors;
  auto fail = [&](const std::string& msg) { errors += (errors.empty() ? "" : "\n") + msg; };
  const long product = (long)p.dp * p.pp * p.cp * p.tp;
  if (product != world_size)
    fail(format("[parallel] dp*pp*cp*tp = %d*%d*%d*%d = %ld does not equal the %d rank(s) "
                "launched (the product of the degrees must equal the world size: launch with "
                "mpirun -np %ld or change the degrees)",
                p.dp, p.pp, p.cp, p.tp, product, world_size, product));
  if (m.n_head % p.tp != 0)
    fail(format("[parallel] tp = %d does not divide [model] n_head = %d (each tensor-parallel "
                "rank holds n_head/tp heads)", p.tp, m.n_head));
  if ((4L * m.d_model) % p.tp != 0)
    fail(format("[parallel] tp = %d does not divide 4*d_model = 4*%d = %d (each tensor-parallel "
                "rank holds 4*d_model/tp columns of the MLP)", p.tp, m.d_model, 4 * m.d_model));
  if (m.padded_vocab() % p.tp != 0)
    fail(format("[parallel] tp = %d does not divide the padded vocabulary %d (vocab_size %d "
                "rounded up to a multiple of 128; each tensor-parallel rank holds padded/tp rows "
                "of wte)", p.tp, m.padded_vocab(), m.vocab_size));
  if (p.tp > 1 && p.sp && m.seq_len % p.tp != 0)
    fail(format("[parallel] tp = %d does not divide [model] seq_len = %d (sequence parallelism "
                "gives each tensor-parallel rank seq_len/tp positions; or set sp = false)",
                p.tp, m.seq_len));
  if (p.cp > 1 && m.seq_len % (2 * p.cp) != 0)
    fail(format("[parallel] cp = %d: 2*cp = %d does not divide [model] seq_len = %d (zigzag "
                "context parallelism cuts each sequence into 2*cp chunks, two per rank)",
                p.cp, 2 * p.cp, m.seq_len));
  else if (p.cp > 1 && p.sp && (m.seq_len / p.cp) % p.tp != 0)
    fail(format("[parallel] tp = %d does not divide seq_len/cp = %d/%d = %d (sequence "
                "parallelism splits each context-parallel rank's positions over tp)",
                p.tp, m.seq_len, p.cp, m.seq_len / p.cp));
  if (p.pp > 1 || p.pp_virtual > 1) {  // the schedule's rules (parallel/pipeline_schedule.h)
    const std::string rules = pipeline_validate(p.pp_schedule, p.pp, cfg.train.grad_accum,
                                                p.pp_virtual, m.n_layer);
    if (!rules.empty())
      fail(format("[parallel] pp = %d, pp_schedule = \"%s\", pp_virtual = %d, [train] "
                  "grad_accum = %d (the micro-batches of a step): ", p.pp, p.pp_schedule.c_str(),
                  p.pp_virtual, cfg.train.grad_accum) + rules);
  }
  if (m.n_layer < p.pp)
    fail(format("[parallel] pp = %d exceeds [model] n_layer = %d (each pipeline stage needs at "
                "least one layer)", p.pp, m.n_layer));
  if ((p.dp * p.cp) % p.ep != 0)
    fail(format("[parallel] ep = %d does not divide dp*cp = %d*%d = %d (expert parallelism "
                "shards the experts over blocks of ep ranks inside dp x cp)",
                p.ep, p.dp, p.cp, p.dp * p.cp));
  return errors;
}

// ---------------------------------------------------------------------------------------------
// The mesh
// ---------------------------------------------------------------------------------------------
// The stats pointers of the comms point into `mesh`: a Mesh must stay where mesh_init built it.
void mesh_init(Mesh& mesh, const Config& cfg, int world_rank, int world_size, int local_rank,
               CommBackend backend) {
  const std::string invalid = mesh_validate(cfg, world_size);
  if (!invalid.empty()) stop_invalid_layout(invalid);
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
