// parallel/mesh.h - the device mesh: world = dp x pp x cp x tp, experts sharded over ep inside
// dp x cp. From [parallel] it gives each rank its coordinates and one communicator per axis.
//
// Rank layout, tp innermost so that a tensor-parallel group lands inside one node:
//
//     world_rank = ((dp_rank * pp + pp_rank) * cp + cp_rank) * tp + tp_rank
//
// Groups (each a Comm in this struct):
//   dp    ranks that differ only in dp_rank           (gradient reduction, FSDP shards)
//   tp    ranks that differ only in tp_rank           (tensor/sequence parallel)
//   pp    ranks that differ only in pp_rank           (pipeline send/recv)
//   cp    ranks that differ only in cp_rank           (ring attention)
//   dpcp  ranks that differ in dp_rank and/or cp_rank (dense gradients when cp > 1)
//   ep    within dpcp, consecutive blocks of ep ranks (expert all-to-all)
//   epdp  within dpcp, ranks with the same ep_rank    (expert gradient reduction)
//   stage ranks with the same pp_rank                  (FP8 amax agreement inside a stage)
//   embed pp ranks 0 and pp-1 of one pipeline          (the tied embedding's gradient)
//
// The degrees were checked against the model and the world size when the config was read
// (config/layout_rules.cu).
#pragma once
#include "config/config.h"
#include "parallel/comm.h"

struct Mesh {
  int world_size = 1, world_rank = 0;
  int local_rank = 0;            // rank among the processes of this node (picks the GPU)
  int dp = 1, tp = 1, pp = 1, cp = 1, ep = 1;
  int dp_rank = 0, tp_rank = 0, pp_rank = 0, cp_rank = 0, ep_rank = 0;
  Comm world, dp_comm, tp_comm, pp_comm, cp_comm, dpcp_comm, ep_comm, epdp_comm;
  Comm stage_comm, embed_comm;
  CommStats stats;               // counters shared by all the comms above
};

// MPI_Init (thread level FUNNELED), world rank/size, local rank, the fatal-error handler that
// aborts every rank. Call first thing in main; a plain `./train config.toml` is one rank.
void runtime_init(int* argc, char*** argv, int* world_rank, int* world_size, int* local_rank);
void runtime_finalize();

// Builds every group with `backend` (the layout passed config/layout_rules.cu). The device must be
// initialised first (ops::device_init) when the backend is NCCL.
void mesh_init(Mesh& mesh, const Config& cfg, int world_rank, int world_size, int local_rank,
               CommBackend backend);
void mesh_destroy(Mesh& mesh);
// The mesh's communicators by axis, for the parameter store.
CommsByAxis mesh_comms(Mesh& mesh);
