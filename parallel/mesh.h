// parallel/mesh.h - the device mesh: world = dp x pp x cp x tp, experts sharded over ep inside
// dp x cp. From [parallel] it gives each rank one group (a Comm: its rank and size in the group,
// and the backend's communicator) per axis.
//
// Rank layout, tp innermost so that a tensor-parallel group lands inside one node:
//
//     world_rank = ((dp_rank * pp + pp_rank) * cp + cp_rank) * tp + tp_rank
//
// Groups (parallel/axis.h), each ordered by the coordinate that varies in it:
//   dp    ranks that differ only in dp_rank           (gradient reduction, FSDP shards); with
//         K DiLoCo islands only those of its island: dp/K consecutive dp ranks
//   island ranks that differ only in their island, at the same place in it (DiLoCo's outer step)
//   island-world  every rank of the island (the world without islands; by world rank)
//   tp    ranks that differ only in tp_rank           (tensor/sequence parallel)
//   pp    ranks that differ only in pp_rank           (pipeline send/recv)
//   cp    ranks that differ only in cp_rank           (ring attention, or the all-to-all)
//   cp-a2a, cp-ring  with cp_comm = "hybrid" (1 < cp_a2a < cp): the cp ranks of this rank's block
//         of cp_a2a consecutive ones (all-to-all; rank cp_rank % cp_a2a), and those at the same
//         place of every block (the ring; rank cp_rank / cp_a2a); otherwise this rank alone
//   dpcp  ranks that differ in dp_rank and/or cp_rank, by dpcp index = dp_rank * cp + cp_rank
//                                                     (dense gradients when cp > 1); with
//         DiLoCo islands only those of its island (dp/K * cp ranks, the same order)
//   ep    within dpcp, consecutive blocks of ep ranks (expert all-to-all); ep_rank = index % ep
//         (the blocks never straddle two islands: ep | dp/K * cp)
//   epdp  within dpcp, ranks with the same ep_rank    (expert gradient reduction; with DiLoCo
//         islands only those of its island)
//   stage ranks with the same pp_rank, by world rank  (FP8 amax agreement inside a stage; with
//         DiLoCo islands only those of its island)
//   embed the pp ranks of the first and the last stage (the tied embedding's gradient; pp
//         ranks 0 and pp-1, or rank 0 alone in the V order)
//   dp-shard, dp*cp-shard, ep-dp-shard      HSDP (dp_replicate = R > 1, parallel/hsdp.cu): the
//   dp-replica, dp*cp-replica, ep-dp-replica  dp, dp*cp or ep-dp group cut into R blocks of
//         consecutive members: the shard group is this rank's block, the replica group the
//         members at its place in every block (R ranks). Without HSDP: the rank alone.
//
// The arithmetic is three pure functions (coordinates, world rank, group members) that the mesh,
// the planner (training/plan.cu) and the checkpoint index (checkpoint/hdf5_format.cu) all use. The
// degrees were checked against the model and the world size when the config was read
// (config/layout_rules.cu).
#pragma once
#include <vector>

#include "config/config.h"
#include "parallel/comm.h"
#include "parallel/pipeline_schedule.h"

// The degrees, and the layout choices that go with them.
struct MeshShape {
  int dp = 1, pp = 1, cp = 1, tp = 1, ep = 1;
  int cp_a2a = 1;      // the all-to-all groups' size inside cp (cp_a2a_degree: 1 for the ring)
  int pp_virtual = 1;  // model chunks per pipeline rank
  bool sp = false;     // sequence parallelism over tp (it changes nothing when tp = 1)
  bool tp_overlap = false;  // [parallel] tp_overlap: tp's collectives in chunks beside the GEMMs
  int islands = 1;     // DiLoCo islands: the dp group is the island's (parallel/diloco.cu)
  int dp_replicate = 1;  // HSDP replicas: the gradient groups' shard and replica sub-groups
  StageOrder pp_order = StageOrder::Loop;  // which rank and chunk hold each pipeline stage
  std::vector<int> pp_layers;  // blocks of each of the pp*pp_virtual stages, in model order
                               // (empty: equal stages)
  int world() const { return dp * pp * cp * tp; }
};
// The shape a config asks for: its degrees, the schedule's stage order and the stage sizes
// (parallel/pipeline_balance.h: pp_layers, pp_balance = "auto", or equal).
MeshShape mesh_shape(const Config& c);

// A rank's coordinates. ep: its rank in its expert-parallel group (dpcp index % ep).
struct MeshCoords {
  int dp = 0, pp = 0, cp = 0, tp = 0, ep = 0;
};
MeshCoords mesh_coords(const MeshShape& m, int world_rank);
int mesh_world_rank(const MeshShape& m, const MeshCoords& c);  // c.ep is implied, not read
// The world ranks of world_rank's group on `axis`, in group order (its index there is its rank).
std::vector<int> mesh_group_members(const MeshShape& m, Axis axis, int world_rank);

struct Mesh {
  MeshShape shape;
  int world_rank = 0;
  int local_rank = 0;  // rank among the processes of this node (picks the GPU)
  Comm groups[(int)Axis::Count];
  CommStats stats;     // counters shared by all the groups above
  Watchdog watch;      // the deadline of their waits ([parallel] timeout_s; 0 = none)
  Comm& operator[](Axis a) { return groups[(int)a]; }
  const Comm& operator[](Axis a) const { return groups[(int)a]; }
};

// Builds every group of world_rank with `backend`. MPI and NCCL connect them: collective over
// the world, and the device must be initialised first (ops::device_init) under NCCL. Count (the
// planner) and None (another rank's place, for the checkpoint index) only describe them. The
// groups point into `mesh` (its stats): a Mesh must stay where mesh_init built it.
void mesh_init(Mesh& mesh, const MeshShape& shape, int world_rank, int local_rank,
               CommBackend backend);
void mesh_destroy(Mesh& mesh);
// The mesh's groups by axis, for the parameter store.
CommsByAxis mesh_comms(Mesh& mesh);
