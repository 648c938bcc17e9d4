// parallel/mesh.cu - the device mesh (parallel/mesh.h): the rank arithmetic as pure functions,
// and one group per axis. Every axis is built on every rank, in the same order (the MPI backend
// makes groups collectively over the world).
#include "parallel/mesh.h"

#include <algorithm>

#include "parallel/pipeline_balance.h"

MeshShape mesh_shape(const Config& c) {
  const ParallelConfig& p = c.parallel;
  MeshShape m;
  m.dp = p.dp, m.pp = p.pp, m.cp = p.cp, m.tp = p.tp, m.ep = p.ep;
  m.pp_virtual = p.pp_virtual;
  m.cp_a2a = cp_a2a_degree(p);
  m.sp = p.sp;
  m.tp_overlap = p.tp_overlap;
  m.islands = std::max(1, p.diloco_islands);  // 0 (off) is one island
  m.dp_replicate = p.dp_replicate;
  if (p.pp > 1 || p.pp_virtual > 1) {
    m.pp_order = pipeline_stage_order(p.pp_schedule);
    m.pp_layers = pipeline_stage_layers(c);
  }
  return m;
}

// ---------------------------------------------------------------------------------------------
// The arithmetic
// ---------------------------------------------------------------------------------------------
MeshCoords mesh_coords(const MeshShape& m, int w) {
  MeshCoords c;
  c.tp = w % m.tp;
  c.cp = w / m.tp % m.cp;
  c.pp = w / (m.tp * m.cp) % m.pp;
  c.dp = w / (m.tp * m.cp * m.pp);
  c.ep = (c.dp * m.cp + c.cp) % m.ep;  // dp x cp, numbered dp-major, cut into blocks of ep
  return c;
}

int mesh_world_rank(const MeshShape& m, const MeshCoords& c) {
  return ((c.dp * m.pp + c.pp) * m.cp + c.cp) * m.tp + c.tp;
}

// The world rank with c's pipeline and tensor coordinates at position i of dp x cp.
static int at_dpcp(const MeshShape& m, MeshCoords c, int i) {
  c.dp = i / m.cp, c.cp = i % m.cp;
  return mesh_world_rank(m, c);
}

// Whether world rank r is in the DiLoCo island of coordinates c (islands: blocks of dp/K dp ranks).
static bool same_island(const MeshShape& m, const MeshCoords& c, int r) {
  const int per = m.dp / m.islands;
  return mesh_coords(m, r).dp / per == c.dp / per;
}

// HSDP's sub-groups of a gradient group (parallel/hsdp.cu): its members cut into R blocks of
// consecutive members; the shard group is w's block, the replica group the members at w's place
// in every block. Without HSDP (R = 1) neither is used: w alone.
// A group cut into blocks of `block` consecutive members: this rank's block (within = true), or
// the members at this rank's place in every block (within = false). HSDP cuts dp (dp*cp, ep-dp)
// into dp_replicate blocks (shard inside, replicas across); hybrid cp cuts cp into blocks of
// cp_a2a (the all-to-all inside, the ring across).
static std::vector<int> block_members(const MeshShape& m, Axis whole, int block, bool within,
                                      int w) {
  const std::vector<int> all = mesh_group_members(m, whole, w);
  CHECK(block > 0 && all.size() % block == 0, "mesh: blocks of %d do not divide the %s group "
        "of %zu ranks", block, axis_name(whole), all.size());
  const int blocks = (int)all.size() / block;
  const int at = (int)(std::find(all.begin(), all.end(), w) - all.begin());
  std::vector<int> g;
  for (int i = 0; i < (within ? block : blocks); i++)
    g.push_back(within ? all[at / block * block + i] : all[i * block + at % block]);
  return g;
}

// HSDP's groups ([parallel] dp_replicate = R): R blocks of the gradient group.
static std::vector<int> hsdp_members(const MeshShape& m, Axis whole, bool shard, int w) {
  const int R = m.dp_replicate;
  if (R <= 1) return {w};
  const int members = (int)mesh_group_members(m, whole, w).size();
  CHECK(members % R == 0, "mesh: dp_replicate = %d does not divide the %s group of %d ranks", R,
        axis_name(whole), members);
  return block_members(m, whole, members / R, shard, w);
}

std::vector<int> mesh_group_members(const MeshShape& m, Axis axis, int w) {
  const MeshCoords c = mesh_coords(m, w);
  // dp x cp is the island's (all of it without DiLoCo): per*cp positions from `first`. The ep
  // blocks lie inside it (config/layout_rules.cu: ep | dp/K * cp), so ep_rank = dpcp % ep is
  // also the rank in the island's numbering.
  const int per = m.dp / m.islands, first = c.dp / per * per * m.cp;
  const int dpcp = c.dp * m.cp + c.cp, blocks = per * m.cp / m.ep;
  std::vector<int> g;
  auto vary = [&](int n, int MeshCoords::*coord) {
    for (int i = 0; i < n; i++) {
      MeshCoords x = c;
      x.*coord = i;
      g.push_back(mesh_world_rank(m, x));
    }
  };
  switch (axis) {
    case Axis::World: for (int r = 0; r < m.world(); r++) g.push_back(r); break;
    case Axis::DP: {  // the island's dp ranks (one island: all of them)
      for (int i = 0; i < per; i++) {
        MeshCoords x = c;
        x.dp = c.dp / per * per + i;
        g.push_back(mesh_world_rank(m, x));
      }
      break;
    }
    case Axis::Island: {  // the same place in every island
      for (int k = 0; k < m.islands; k++) {
        MeshCoords x = c;
        x.dp = k * per + c.dp % per;
        g.push_back(mesh_world_rank(m, x));
      }
      break;
    }
    case Axis::TP: vary(m.tp, &MeshCoords::tp); break;
    case Axis::PP: vary(m.pp, &MeshCoords::pp); break;
    case Axis::CP: vary(m.cp, &MeshCoords::cp); break;
    case Axis::CPA2A:  // hybrid only: blocks of cp_a2a cp ranks, and across the blocks
    case Axis::CPRing:
      if (m.cp_a2a <= 1 || m.cp_a2a >= m.cp) return {w};
      return block_members(m, Axis::CP, m.cp_a2a, axis == Axis::CPA2A, w);
    case Axis::DPCP:  // (the island's)
      for (int i = 0; i < per * m.cp; i++) g.push_back(at_dpcp(m, c, first + i));
      break;
    case Axis::EP:
      for (int j = 0; j < m.ep; j++) g.push_back(at_dpcp(m, c, dpcp / m.ep * m.ep + j));
      break;
    case Axis::EPDP:  // (the island's)
      for (int j = 0; j < blocks; j++) g.push_back(at_dpcp(m, c, first + j * m.ep + c.ep));
      break;
    case Axis::Stage:  // (inside the island)
      for (int r = 0; r < m.world(); r++)
        if (mesh_coords(m, r).pp == c.pp && same_island(m, c, r)) g.push_back(r);
      break;
    case Axis::IslandWorld:
      for (int r = 0; r < m.world(); r++)
        if (same_island(m, c, r)) g.push_back(r);
      break;
    case Axis::Embed: {  // the ranks of the first and the last stage; anyone else is alone
      const int last = pipeline_stage_owner(m.pp_order, m.pp, m.pp * m.pp_virtual - 1);
      if (last != 0 && (c.pp == 0 || c.pp == last)) {  // (the V order puts both on pp rank 0)
        MeshCoords first = c, end = c;
        first.pp = 0, end.pp = last;
        g = {mesh_world_rank(m, first), mesh_world_rank(m, end)};
      } else {
        g = {w};
      }
      break;
    }
    case Axis::DPShard: return hsdp_members(m, Axis::DP, true, w);
    case Axis::DPReplica: return hsdp_members(m, Axis::DP, false, w);
    case Axis::DPCPShard: return hsdp_members(m, Axis::DPCP, true, w);
    case Axis::DPCPReplica: return hsdp_members(m, Axis::DPCP, false, w);
    case Axis::EPDPShard: return hsdp_members(m, Axis::EPDP, true, w);
    case Axis::EPDPReplica: return hsdp_members(m, Axis::EPDP, false, w);
    case Axis::Count: BUG("mesh_group_members: no such axis");
  }
  return g;
}

// ---------------------------------------------------------------------------------------------
// The groups
// ---------------------------------------------------------------------------------------------
void mesh_init(Mesh& mesh, const MeshShape& shape, int world_rank, int local_rank,
               CommBackend backend) {
  CHECK(world_rank >= 0 && world_rank < shape.world(), "mesh: world rank %d outside a mesh of %d",
        world_rank, shape.world());
  if (backend == CommBackend::NCCL) nccl_require();
  mesh.shape = shape;
  mesh.world_rank = world_rank;
  mesh.local_rank = local_rank;
  mesh.stats = CommStats{};
  for (int a = 0; a < (int)Axis::Count; a++)
    comm_create(mesh.groups[a], (Axis)a, mesh_group_members(shape, (Axis)a, world_rank),
                world_rank, backend, &mesh.stats, &mesh.watch);
}

void mesh_destroy(Mesh& mesh) {
  for (Comm& c : mesh.groups) comm_destroy(c);
  mesh.stats = CommStats{};
}

CommsByAxis mesh_comms(Mesh& mesh) {
  CommsByAxis c;
  for (int a = 0; a < (int)Axis::Count; a++) c.axis[a] = &mesh.groups[a];
  return c;
}
