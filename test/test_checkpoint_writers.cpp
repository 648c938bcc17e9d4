// test/test_checkpoint_writers.cpp - the checkpoint's writer geometry and its HDF5 mapping
// (checkpoint/hdf5_format.h) for every kind of layout, without training: one process plays
// every rank of a layout, writing and reading real checkpoint files.
//
// Models: a tiny MoE GPT (L=4, NH=4, C=32, T=16, V=50; E=4 experts of d_expert 24 in blocks 1
// and 3) and the same model dense. For each writing layout (dp, cp, tp, pp, pp_virtual, ep, FSDP
// or DDP, SP, HSDP's replicas; ep = 1, 2, 4 crossed with the others):
//  - each rank holds what the trainer's would: its layout (gpt_layout with its tp, pp, cp and ep
//    ranks, coordinates as parallel/mesh.h numbers them) and of each unit its FSDP shard over
//    the unit's group (dp, dp x cp, or for experts the ranks of its ep rank; under HSDP the
//    replica's block of them; all of it under DDP), every element of master, m and v set to a code of (state, tensor, logical element).
//    It writes its rank file (h5_write_rank_file refuses a slice outside what the rank holds);
//  - rank 0 writes the index (h5_write_index refuses a tensor whose elements the writers do not
//    hold exactly once);
//  - the datasets have the logical shapes: experts (E, d_expert, C), (E, C, d_expert), (E,
//    d_expert), (E, C); the router (E, C); dense tensors as before;
//  - every rank of a reading layout loads its shards of the three states through the index, as
//    resume does (h5_index_fill): each element is its code, so nothing is missing (NaN) or
//    misplaced. Every checkpoint is read by one rank (whole tensors: with the count check this
//    proves each element written exactly once); the first one also by dp4 x ep4 FSDP, dp2 x cp2
//    x tp2 x pp2 x ep2 FSDP with SP, dp4 x ep2 FSDP in 2 HSDP replicas, and others (each rank reads its blocks: the resharding).
// And the count check catches a writer left out of the index.
// Prints one line per check; exits 1 on any failure.
#include <hdf5.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "checkpoint/hdf5_format.h"
#include "model/init.h"
#include "test/check_results.h"
#include "test/layout_fixtures.h"

namespace {

struct Layout {
  int dp = 1, cp = 1, tp = 1, pp = 1, v = 1, ep = 1;
  bool fsdp = false, sp = false;
  int replicas = 1;  // HSDP: [parallel] dp_replicate
  int world() const { return dp * cp * tp * pp; }
  std::string text() const {
    char s[160];
    std::snprintf(s, sizeof(s), "dp%d cp%d tp%d pp%d v%d ep%d %s%s%s", dp, cp, tp, pp, v, ep,
                  fsdp ? "FSDP" : "DDP", sp ? " SP" : "",
                  replicas > 1 ? (" HSDP x" + std::to_string(replicas)).c_str() : "");
    return s;
  }
};

// One rank's coordinates, as parallel/mesh.h numbers them.
struct Coords {
  int dp_rank, pp_rank, cp_rank, tp_rank, dpcp_index, ep_rank;
};
Coords coords(const Layout& l, int world_rank) {
  const RankCoords r = rank_coords(world_rank, l.pp, l.cp, l.tp);
  Coords c;
  c.dp_rank = r.dp, c.pp_rank = r.pp, c.cp_rank = r.cp, c.tp_rank = r.tp;
  c.dpcp_index = c.dp_rank * l.cp + c.cp_rank;
  c.ep_rank = c.dpcp_index % l.ep;
  return c;
}

// Rank w's layout, over `mesh` made to describe it (parallel/mesh.h; the layout points into it).
GPTLayout rank_layout(const ModelConfig& m, const Layout& l, int w, Mesh& mesh) {
  MeshShape shape;
  shape.dp = l.dp, shape.cp = l.cp, shape.tp = l.tp, shape.pp = l.pp, shape.ep = l.ep;
  shape.pp_virtual = l.v, shape.sp = l.sp;
  shape.dp_replicate = l.replicas;
  mesh_init(mesh, shape, w, 0, CommBackend::None);
  return gpt_layout(m, mesh);
}

// A unit's group (the one that sums its gradient and that FSDP shards over): this rank's index
// in it and its size, from mesh.h's definitions of the dp, dpcp and epdp groups; under HSDP
// the block of size/R consecutive ones holding this rank (parallel/hsdp.cu).
void unit_group(const ParamUnit& u, const Layout& l, const Coords& c, int* rank, int* size) {
  if (u.grad_axis == Axis::EPDP) *rank = c.dpcp_index / l.ep, *size = l.dp * l.cp / l.ep;
  else if (u.grad_axis == Axis::DPCP) *rank = c.dpcp_index, *size = l.dp * l.cp;
  else *rank = c.dp_rank, *size = l.dp;
  *size /= l.replicas;
  *rank %= *size;
}

// The code of element `i` (row-major, over the logical tensor) of state `kind` of tensor t:
// exact in fp32 (< 2^23), different per state, per tensor (mostly) and per element.
float code(StateKind kind, const TensorPlacement& t, int64_t i) {
  return (float)((int64_t)kind * (1 << 21) + (int64_t)(tensor_key(t.name) % 64) * (1 << 15) + i);
}
ParamFill code_fill(StateKind kind) {
  return [kind](const TensorPlacement& t, const Block& b, float* dst) {
    for (int64_t r = 0; r < b.rows; r++)
      for (int64_t c = 0; c < b.cols; c++)
        dst[r * b.cols + c] = code(kind, t, (b.row + r) * t.cols + b.col + c);
  };
}

const StateKind kKinds[] = {StateKind::Master, StateKind::AdamM, StateKind::AdamV};

// What one rank holds: of each unit its shard (parallel/param_store.cu's geometry), in host
// memory (the CPU backend's device memory is host memory).
struct HostStore {
  ParamStore store;
  std::vector<float> memory;
};
void host_store_init(HostStore& h, const GPTLayout& g, const Layout& l, const Coords& c) {
  size_t total = 0;
  for (const ParamUnit& u : g.units) {
    UnitState us;
    int rank = 0, size = 1;
    unit_group(u, l, c, &rank, &size);
    const FlatRange shard = l.fsdp ? shard_range(u.numel, rank, size) : FlatRange{0, u.numel};
    us.numel = u.numel;
    us.shard_offset = shard.first;
    us.shard_numel = shard.size();
    h.store.units.push_back(us);
    total += 3 * us.shard_numel;
  }
  h.memory.assign(total, 0.0f);
  float* p = h.memory.data();
  for (UnitState& us : h.store.units) {
    us.master = p, us.adam_m = p + us.shard_numel, us.adam_v = p + 2 * us.shard_numel;
    p += 3 * us.shard_numel;
  }
}

// Every rank of `l` writes its file into dir, then the index; "" or the problem. index_ep > 0:
// the index is told that ep degree instead of l's (a broken index).
std::string write_checkpoint(const std::string& dir, const ModelConfig& m, const Layout& l,
                             int index_ep = 0) {
  for (int w = 0; w < l.world(); w++) {
    const Coords c = coords(l, w);
    Mesh mesh;
    const GPTLayout g = rank_layout(m, l, w, mesh);
    HostStore h;
    host_store_init(h, g, l, c);
    for (StateKind kind : kKinds) param_store_load(h.store, g.units, code_fill(kind), kind);
    const WriterShards shards{c.dpcp_index, l.dp * l.cp, l.ep};
    const std::string problem =
        h5_write_rank_file(dir + "/" + rank_file_name(w), h.store, g, shards, mesh.shape, nullptr);
    if (!problem.empty()) return problem;
  }
  CheckpointMeta meta;
  meta.writers = l.world();
  meta.writer_tp = l.tp, meta.writer_cp = l.cp, meta.writer_pp = l.pp;
  meta.writer_pp_virtual = l.v, meta.writer_ep = index_ep > 0 ? index_ep : l.ep;
  meta.writer_dp_replicate = l.replicas;
  Mesh mesh;
  const GPTLayout g0 = rank_layout(m, l, 0, mesh);
  meta.L = g0.L, meta.NH = g0.NH, meta.C = g0.C, meta.T = g0.T, meta.V = g0.V, meta.Vp = g0.Vp;
  meta.maxT = g0.maxT;
  // The writers' units come from what they hold (l), their places from the index's record.
  return h5_write_index(dir + "/" + kIndexFileName, writer_units(m, mesh.shape), meta, nullptr);
}

// Every rank of `l` loads its shards through the index; the number of units whose shard is not
// exactly the codes (the first one named in *first_bad).
int read_mismatches(const CheckpointIndex& index, const ModelConfig& m, const Layout& l,
                    std::string* first_bad) {
  int bad = 0;
  for (int r = 0; r < l.world(); r++) {
    const Coords c = coords(l, r);
    Mesh mesh;
    const GPTLayout g = rank_layout(m, l, r, mesh);
    HostStore got, want;
    host_store_init(got, g, l, c);
    host_store_init(want, g, l, c);
    for (StateKind kind : kKinds) {
      param_store_load(got.store, g.units, h5_index_fill(index, kind), kind);
      param_store_load(want.store, g.units, code_fill(kind), kind);
    }
    for (size_t u = 0; u < g.units.size(); u++) {
      const UnitState& a = got.store.units[u];
      const UnitState& b = want.store.units[u];
      // master, m and v lie back to back (host_store_init): one comparison covers the three
      if (std::memcmp(a.master, b.master, 3 * a.shard_numel * sizeof(float)) == 0) continue;
      if (bad++ == 0)
        *first_bad = "rank " + std::to_string(r) + " unit " + std::to_string(u) + " (" +
                     g.units[u].tensors[0].name + ", ...)";
    }
  }
  return bad;
}

// The dims of dataset `name` in the index; empty if there is none.
std::vector<hsize_t> dataset_shape(const std::string& index_path, const std::string& name) {
  hid_t f = H5Fopen(index_path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  std::vector<hsize_t> dims;
  if (f < 0) return dims;
  if (H5Lexists(f, name.c_str(), H5P_DEFAULT) > 0) {
    hid_t ds = H5Dopen2(f, name.c_str(), H5P_DEFAULT);
    hid_t space = H5Dget_space(ds);
    dims.resize(H5Sget_simple_extent_ndims(space));
    H5Sget_simple_extent_dims(space, dims.data(), nullptr);
    H5Sclose(space);
    H5Dclose(ds);
  }
  H5Fclose(f);
  return dims;
}

void check_shapes(Results& res, const std::string& index_path, const ModelConfig& m) {
  const hsize_t E = m.n_experts, D = m.expert_hidden(), C = m.d_model;
  struct Want {
    std::string name;
    std::vector<hsize_t> dims;
  };
  std::vector<Want> wants = {{"model/h.0/mlp/fc/weight", {4 * C, C}},
                             {"optim/v/h.0/mlp/fc/bias", {4 * C}},
                             {"model/h.1/attn/qkv/weight", {3 * C, C}}};
  for (const char* state : {"model", "optim/m", "optim/v"}) {
    const std::string h = std::string(state) + "/h.1/mlp/";
    wants.push_back({h + "router/weight", {E, C}});
    wants.push_back({h + "experts/fc/weight", {E, D, C}});
    wants.push_back({h + "experts/proj/weight", {E, C, D}});
    wants.push_back({h + "experts/fc/bias", {E, D}});
    wants.push_back({h + "experts/proj/bias", {E, C}});
  }
  std::string wrong;
  for (const Want& w : wants)
    if (dataset_shape(index_path, w.name) != w.dims) wrong += " " + w.name;
  res.check(wrong.empty(), "MoE index: experts (E, D, C), (E, C, D), (E, D), (E, C), router (E, "
            "C), dense tensors 2-D/1-D; wrong:%s", wrong.empty() ? " none" : wrong.c_str());
}

std::string make_temp_dir() {
  char tmpl[] = "/tmp/test_checkpoint_writers.XXXXXX";
  const char* d = mkdtemp(tmpl);
  if (!d) std::abort();
  return d;
}

void remove_dir(const std::string& dir) {
  const std::string cmd = "rm -rf '" + dir + "'";
  if (std::system(cmd.c_str()) != 0) std::printf("note: could not remove %s\n", dir.c_str());
}

Layout layout(int dp, int cp, int tp, int pp, int v, int ep, bool fsdp, bool sp = false,
              int replicas = 1) {
  Layout l;
  l.dp = dp, l.cp = cp, l.tp = tp, l.pp = pp, l.v = v, l.ep = ep, l.fsdp = fsdp, l.sp = sp;
  l.replicas = replicas;
  return l;
}

void check_model(Results& res, const ModelConfig& m, const std::vector<Layout>& writers,
                 const std::vector<Layout>& readers) {
  const char* kind = m.n_experts > 0 ? "MoE" : "dense";
  for (size_t i = 0; i < writers.size(); i++) {
    const Layout& w = writers[i];
    const std::string dir = make_temp_dir();
    const std::string problem = write_checkpoint(dir, m, w);
    res.check(problem.empty(), "%s, written at %s: every element by exactly one writer%s%s", kind,
              w.text().c_str(), problem.empty() ? "" : ": ", problem.c_str());
    if (problem.empty()) {
      if (m.n_experts > 0 && i == 0) check_shapes(res, dir + "/" + kIndexFileName, m);
      CheckpointIndex index;
      CheckpointMeta meta;
      const std::string open = h5_open_index(dir + "/" + kIndexFileName, &index, &meta);
      res.check(open.empty(), "%s: index opens %s", w.text().c_str(), open.c_str());
      // Every checkpoint read whole (one rank); the first one by every reading layout.
      const auto end = i == 0 ? readers.end() : readers.begin() + 1;
      for (auto r = readers.begin(); r != end; ++r) {
        if (!open.empty()) break;
        std::string first_bad;
        const int bad = read_mismatches(index, m, *r, &first_bad);
        res.check(bad == 0, "%s %s -> %s: every rank reads its shards exactly", kind,
                  w.text().c_str(), r->text().c_str());
        if (bad) std::printf("     %d units differ, first %s\n", bad, first_bad.c_str());
      }
      h5_close_index(index);
    }
    remove_dir(dir);
  }
}

// An index that ignores ep (as before experts existed) maps every writer with the experts of ep
// rank 0, over the dense units' slices: it refuses the expert tensors, naming one.
void check_detection(Results& res, const ModelConfig& m) {
  const std::string dir = make_temp_dir();
  const std::string problem = write_checkpoint(dir, m, layout(2, 1, 1, 1, 1, 2, true), 1);
  res.check(problem.find("experts/") != std::string::npos &&
                problem.find("not each one once") != std::string::npos,
            "an index blind to ep is refused: %s", problem.c_str());
  remove_dir(dir);
}

}  // namespace

int main() {
  Results res;
  // dp, cp, tp, pp, pp_virtual, ep, FSDP, SP
  const std::vector<Layout> writers = {
      layout(2, 1, 1, 1, 1, 2, true),        layout(1, 1, 1, 1, 1, 1, false),
      layout(2, 1, 1, 1, 1, 2, false),       layout(4, 1, 1, 1, 1, 4, true),
      layout(4, 1, 1, 1, 1, 2, true),        layout(2, 2, 1, 1, 1, 4, true),
      layout(2, 2, 1, 1, 1, 2, false),       layout(2, 1, 2, 1, 1, 2, true, true),
      layout(2, 1, 1, 2, 1, 2, true),        layout(2, 1, 1, 2, 2, 2, false),
      layout(2, 2, 2, 2, 1, 4, true, true),  layout(4, 1, 2, 1, 1, 1, true),
      // HSDP (dp_replicate): the dp, dp x cp and expert groups cut into replicas
      layout(4, 1, 1, 1, 1, 2, true, false, 2), layout(2, 2, 1, 1, 1, 2, true, false, 2),
      layout(4, 1, 2, 1, 1, 1, true, true, 4),  layout(4, 1, 1, 1, 1, 1, false, false, 2),
  };
  const std::vector<Layout> readers = {
      layout(1, 1, 1, 1, 1, 1, false),       layout(4, 1, 1, 1, 1, 4, true),
      layout(2, 2, 2, 2, 1, 2, true, true),  layout(2, 1, 1, 2, 2, 2, false),
      layout(1, 2, 4, 1, 1, 1, true),        layout(4, 1, 1, 1, 1, 2, true, false, 2),
  };
  check_model(res, tiny_model(4), writers, readers);
  check_model(res, tiny_model(0),
              {layout(2, 2, 2, 2, 1, 1, true), layout(4, 1, 1, 1, 1, 1, false)},
              {layout(1, 1, 1, 1, 1, 1, false), layout(2, 1, 4, 1, 1, 1, true)});
  check_detection(res, tiny_model(4));
  std::printf("\n%d checks, %d failures\n", res.checks, res.failures);
  return res.exit_status();
}
