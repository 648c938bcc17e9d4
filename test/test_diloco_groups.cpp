// test/test_diloco_groups.cpp - the mesh's groups with DiLoCo islands (parallel/mesh.h), and the
// placement they give, for layouts with cp, ep and experts inside the islands. One process plays
// every rank of a layout through described meshes (CommBackend::None); no training.
//
// For each layout (dp, K islands, cp, tp, pp, ep; a dense and an MoE model):
//  1. Every group on the axes an island owns is the one written down here from the coordinates
//     (the test's own formula, not mesh.cu's): island = dp_rank / (dp/K), island dp x cp index
//     local = (dp_rank % (dp/K)) * cp + cp_rank;
//       dp      same island, pp, cp, tp             ordered by dp_rank
//       dp*cp   same island, pp, tp                 ordered by local
//       ep      same island, pp, tp, local / ep     ordered by local % ep
//       ep-dp   same island, pp, tp, local % ep     ordered by local
//       stage   same island, pp                     ordered by world rank
//       island-world  same island                   ordered by world rank
//       island  same dp_rank % (dp/K), pp, cp, tp   ordered by island
//     so nothing an island reduces over reaches another island.
//  2. The placement: every rank w and every member r of w's island group have the same units
//     (gpt_layout: tensor names, lengths, gradient axis), the same index and size in each unit's
//     gradient group, hence the same FSDP shard of every unit (shard_range), and the same
//     checkpoint writer slice (save_writer_shards: index, count, ep; only the island differs).
//     That is what makes DiLoCo's outer step elementwise on each rank's shard.
//  3. Each unit's gradient group is a group of the mesh: w's index in it is the writer index the
//     checkpoint uses (dense: the dp x cp index; experts: that / ep).
// Prints one line per layout and model (and each failure); exits 1 on any failure.
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "checkpoint/save_phases.h"
#include "model/gpt.h"
#include "test/check_results.h"
#include "test/layout_fixtures.h"

namespace {

struct Layout {
  int dp, islands, cp, tp, pp, ep;
  int world() const { return dp * cp * tp * pp; }
  int per() const { return dp / islands; }
};

struct Place : RankCoords {  // and where in its island
  int island, local;
};

Place place(const Layout& l, int w) {
  Place p;
  static_cast<RankCoords&>(p) = rank_coords(w, l.pp, l.cp, l.tp);
  p.island = p.dp / l.per();
  p.local = p.dp % l.per() * l.cp + p.cp;
  return p;
}

// (what the members share, the order inside the group) for rank w on axis a.
std::pair<std::vector<int>, int> key(const Layout& l, Axis a, int w) {
  const Place p = place(l, w);
  switch (a) {
    case Axis::DP: return {{p.island, p.pp, p.cp, p.tp}, p.dp};
    case Axis::DPCP: return {{p.island, p.pp, p.tp}, p.local};
    case Axis::EP: return {{p.island, p.pp, p.tp, p.local / l.ep}, p.local % l.ep};
    case Axis::EPDP: return {{p.island, p.pp, p.tp, p.local % l.ep}, p.local};
    case Axis::Stage: return {{p.island, p.pp}, w};
    case Axis::IslandWorld: return {{p.island}, w};
    case Axis::Island: return {{p.dp % l.per(), p.pp, p.cp, p.tp}, p.island};
    default: return {{}, 0};
  }
}

std::vector<int> expected_members(const Layout& l, Axis a, int w) {
  std::map<int, int> by_order;  // order -> world rank
  for (int r = 0; r < l.world(); r++)
    if (key(l, a, r).first == key(l, a, w).first) by_order[key(l, a, r).second] = r;
  std::vector<int> members;
  for (const auto& [order, r] : by_order) members.push_back(r);
  return members;
}

MeshShape shape_of(const Layout& l) {
  MeshShape s;
  s.dp = l.dp, s.cp = l.cp, s.tp = l.tp, s.pp = l.pp, s.ep = l.ep, s.islands = l.islands;
  return s;
}

int index_in(const std::vector<int>& members, int w) {
  for (size_t i = 0; i < members.size(); i++)
    if (members[i] == w) return (int)i;
  return -1;
}

// One rank, described: its mesh and its layout (which points into the mesh).
struct RankView {
  Mesh mesh;
  GPTLayout layout;
  WriterShards writer;
};

void describe(RankView& v, const ModelConfig& m, const Layout& l, int w) {
  mesh_init(v.mesh, shape_of(l), w, 0, CommBackend::None);
  v.layout = gpt_layout(m, v.mesh);
  v.writer = save_writer_shards(v.mesh);
}

const Axis kIslandAxes[] = {Axis::DP,    Axis::DPCP,        Axis::EP,    Axis::EPDP,
                            Axis::Stage, Axis::IslandWorld, Axis::Island};

int check_groups(const Layout& l, std::string* first) {
  int bad = 0;
  for (int w = 0; w < l.world(); w++)
    for (Axis a : kIslandAxes)
      if (mesh_group_members(shape_of(l), a, w) != expected_members(l, a, w)) {
        if (!bad++) *first = std::string("group ") + axis_name(a) + " of rank " + std::to_string(w);
      }
  return bad;
}

bool fail(std::string* why, const std::string& what) {
  *why = what;
  return false;
}

// w's and r's units, their groups and shards: the same, element for element.
bool same_shards(const RankView& a, const RankView& b, int wa, int wb, std::string* why) {
  const std::vector<ParamUnit>& ua = a.layout.units;
  const std::vector<ParamUnit>& ub = b.layout.units;
  if (ua.size() != ub.size()) return fail(why, "unit count");
  for (size_t u = 0; u < ua.size(); u++) {
    if (ua[u].numel != ub[u].numel || ua[u].grad_axis != ub[u].grad_axis ||
        ua[u].tensors.size() != ub[u].tensors.size())
      return fail(why, "unit " + std::to_string(u));
    for (size_t t = 0; t < ua[u].tensors.size(); t++)
      if (ua[u].tensors[t].name != ub[u].tensors[t].name)
        return fail(why, "tensor " + ua[u].tensors[t].name);
    const Axis g = ua[u].grad_axis;
    const std::vector<int> ga = mesh_group_members(a.mesh.shape, g, wa);
    const std::vector<int> gb = mesh_group_members(b.mesh.shape, g, wb);
    const int ia = index_in(ga, wa), ib = index_in(gb, wb);
    const FlatRange sa = shard_range(ua[u].numel, ia, (int)ga.size());
    const FlatRange sb = shard_range(ub[u].numel, ib, (int)gb.size());
    if (ia != ib || ga.size() != gb.size() || sa.first != sb.first || sa.size() != sb.size())
      return fail(why, "shard of unit " + std::to_string(u) + " (" + axis_name(g) + ")");
  }
  const WriterShards &x = a.writer, &y = b.writer;
  if (x.index != y.index || x.count != y.count || x.ep != y.ep)
    return fail(why, "checkpoint writer slice");
  return true;
}

// The gradient group of each unit of w is the writer slice the checkpoint assumes.
bool writer_matches_groups(const RankView& v, int w, std::string* why) {
  for (const ParamUnit& u : v.layout.units) {
    const std::vector<int> g = mesh_group_members(v.mesh.shape, u.grad_axis, w);
    const bool experts = u.grad_axis == Axis::EPDP;
    const int want = experts ? v.writer.index / v.writer.ep : v.writer.index;
    const int count = experts ? v.writer.count / v.writer.ep : v.writer.count;
    if (index_in(g, w) != want || (int)g.size() != count)
      return fail(why, std::string("writer slice vs the ") + axis_name(u.grad_axis) + " group");
  }
  return true;
}

void check_layout(Results& res, const ModelConfig& m, const Layout& l) {
  char name[160];
  std::snprintf(name, sizeof(name), "%s dp%d K%d cp%d tp%d pp%d ep%d (%d ranks)",
                m.n_experts > 0 ? "MoE" : "dense", l.dp, l.islands, l.cp, l.tp, l.pp, l.ep,
                l.world());
  std::string first;
  const int bad = check_groups(l, &first);
  res.check(bad == 0, "%s: island-local groups = the formula (%d wrong%s%s)", name, bad,
            bad ? ", first: " : "", first.c_str());
  std::vector<RankView> views(l.world());
  for (int w = 0; w < l.world(); w++) describe(views[w], m, l, w);
  int pairs = 0, differ = 0, writer_bad = 0;
  std::string why;
  for (int w = 0; w < l.world(); w++) {
    if (!writer_matches_groups(views[w], w, &why)) writer_bad++;
    for (int r : mesh_group_members(shape_of(l), Axis::Island, w)) {
      pairs++;
      if (!same_shards(views[w], views[r], w, r, &why)) differ++;
    }
  }
  res.check(differ == 0 && writer_bad == 0 && pairs == l.world() * l.islands,
            "%s: %d island pairs hold the same shards (%d differ, %d writer slices off the groups%s%s)",
            name, pairs, differ, writer_bad, why.empty() ? "" : ": ", why.c_str());
  for (RankView& v : views) mesh_destroy(v.mesh);
}

}  // namespace

int main() {
  Results res;
  res.verbose = true;
  // dp, K, cp, tp, pp, ep
  const std::vector<Layout> dense = {
      {4, 2, 2, 1, 1, 1}, {6, 3, 2, 1, 1, 1}, {2, 2, 2, 2, 2, 1}, {4, 2, 1, 1, 1, 1},
  };
  const std::vector<Layout> moe = {
      {4, 2, 1, 1, 1, 2}, {2, 2, 2, 1, 1, 2}, {4, 2, 2, 1, 1, 2}, {4, 2, 2, 1, 1, 4},
      {6, 3, 2, 1, 1, 4}, {2, 2, 2, 2, 2, 2}, {4, 4, 2, 1, 2, 2},
  };
  for (const Layout& l : dense) check_layout(res, tiny_model(0), l);
  for (const Layout& l : moe) check_layout(res, tiny_model(4), l);
  std::printf("\n%d checks, %d failures\n", res.checks, res.failures);
  return res.exit_status();
}
