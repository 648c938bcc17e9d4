// checkpoint/hdf5_format.cu - writing checkpoints in HDF5: rank files and the virtual-dataset
// index (see checkpoint/hdf5_format.h; reading is checkpoint/hdf5_read.cu).
//
// Every file is built by one process in memory (HDF5's core driver: no MPI-IO, no collective
// metadata) and written with plain POSIX calls. HDF5 errors are C++ exceptions inside
// (checkpoint/hdf5_plumbing.h) and returned messages at the edges, so that a rank whose disk is
// full can report it and let the ranks agree, instead of dying alone in the middle of a save.
#include "checkpoint/hdf5_format.h"

#include <hdf5.h>

#include <algorithm>
#include <array>
#include <map>
#include <cmath>
#include <stdexcept>

#include "checkpoint/hdf5_plumbing.h"
#include "kernels/ops.h"

using namespace h5;

static_assert(sizeof(hid_t) == sizeof(int64_t), "CheckpointIndex keeps a hid_t in an int64_t");

const char* const kIndexFileName = "checkpoint.h5";

std::string rank_file_name(int writer) {
  char name[32];
  std::snprintf(name, sizeof(name), "rank_%05d.h5", writer);
  return name;
}

std::string island_prefix(int island) {
  return island == 0 ? "" : "diloco/island_" + std::to_string(island) + "/";
}

FlatRange writer_range(const ParamUnit& u, const WriterShards& s, int tp_rank) {
  const bool experts = u.grad_axis == Axis::EPDP;  // held by the ranks of one ep rank only
  const int rank = experts ? s.index / s.ep : s.index, ranks = experts ? s.count / s.ep : s.count;
  return clip(saver_range(u, rank, ranks), owned_end(u, tp_rank));
}

MeshShape writer_shape(const CheckpointMeta& m) {
  MeshShape shape;
  shape.tp = m.writer_tp, shape.cp = m.writer_cp, shape.pp = m.writer_pp, shape.ep = m.writer_ep;
  shape.pp_virtual = m.writer_pp_virtual;
  shape.pp_order = m.writer_pp_order == 1 ? StageOrder::V : StageOrder::Loop;
  shape.pp_layers = m.writer_pp_layers;
  shape.dp = m.writers / (shape.tp * shape.cp * shape.pp);
  shape.islands = std::max(1, m.islands);
  shape.dp_replicate = m.writer_dp_replicate;
  return shape;
}

// A writer's local layout depends on its pp, tp and ep coordinates only; each is laid out over a
// described mesh (parallel/mesh.h) with the writers' degrees, at a rank with those coordinates.
WriterUnits writer_units(const ModelConfig& model, const MeshShape& writers) {
  MeshShape shape = writers;
  // enough dp x cp positions for every ep rank, and HSDP's replicas; dp changes no layout
  shape.dp = writers.ep * writers.dp_replicate;
  shape.islands = 1;      // (nor do DiLoCo islands)
  WriterUnits all;
  for (int p = 0; p < shape.pp; p++)
    for (int t = 0; t < shape.tp; t++)
      for (int e = 0; e < shape.ep; e++) {
        MeshCoords c;
        c.dp = e / shape.cp, c.cp = e % shape.cp, c.pp = p, c.tp = t;
        Mesh mesh;
        mesh_init(mesh, shape, mesh_world_rank(shape, c), 0, CommBackend::None);
        all.push_back(gpt_layout(model, mesh).units);
        mesh_destroy(mesh);
      }
  return all;
}


// ---------------------------------------------------------------------------------------------
// Writing
// ---------------------------------------------------------------------------------------------
// A file built in memory: HDF5's core driver without a backing store, growing by `increment`
// bytes (the expected size, so that it is allocated once). Nothing touches the disk until
// write_image, which closes it (a close in memory cannot fail for want of disk space) and writes
// the image with plain POSIX calls.
static hid_t create_in_memory(const std::string& path, size_t increment) {
  H5Id fapl(ok(H5Pcreate(H5P_FILE_ACCESS), "H5Pcreate"));
  ok(H5Pset_fapl_core(fapl, std::max(increment, (size_t)1 << 20), /*backing_store=*/0),
     "H5Pset_fapl_core");
  return ok(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl), "cannot create");
}

static std::string write_image(H5Id& file, const std::string& path, FileDigest* digest) {
  ok(H5Fflush(file, H5F_SCOPE_GLOBAL), "cannot flush");
  const ssize_t bytes = ok(H5Fget_file_image(file, nullptr, 0), "H5Fget_file_image");
  std::vector<char> image((size_t)bytes);
  ok(H5Fget_file_image(file, image.data(), image.size()), "H5Fget_file_image");
  ok(H5Fclose(file.release()), "cannot close");
  return write_bytes_synced(path, image.data(), image.size(), digest);
}

size_t RankFileContents::item_floats(size_t i) const {
  return i < parts.size() ? parts[i].range.size() : residuals[i - parts.size()].numel;
}

size_t RankFileContents::floats() const {
  size_t n = 0;
  for (size_t i = 0; i < items(); i++) n += item_floats(i);
  return n;
}

RankFileContents rank_file_contents(const GPTLayout& layout, const WriterShards& shards,
                                    const ParamStore& store, const MeshShape& shape) {
  RankFileContents c;
  c.shard_rank = shards.index, c.tp_rank = layout.tp.rank(), c.pp_rank = layout.pp.rank();
  c.ep_rank = layout.ep->rank;
  const bool outer = store.outer.on() && shards.island == 0;
  for (StateKind kind : kAllKinds) {
    if (is_outer_state(kind) && !outer) continue;  // DiLoCo's, saved by island 0
    for (size_t u = 0; u < layout.units.size(); u++) {
      const FlatRange range = writer_range(layout.units[u], shards, (int)c.tp_rank);
      if (range.size() > 0) c.parts.push_back({kind, (int)u, range});
    }
  }
  if (!store_has_residuals(store)) return c;
  c.residual_layout = residual_layout(store, layout, shape);
  for (size_t u = 0; u < store.units.size(); u++) {
    if (store.compression.residual_at(u))
      c.residuals.push_back({(int)u, store.compression.residual_numel_at(u), false});
    if (store.outer.residual_at(u))
      c.residuals.push_back({(int)u, store.outer.residual_numel_at(u), true});
  }
  return c;
}

bool store_has_residuals(const ParamStore& store) {
  return store_compressed(store) || store.outer.compressed();
}

// The residual of an item or of unit u: the gradient's or DiLoCo's outer one.
static float* residual_of(ParamStore& store, int unit, bool outer) {
  return outer ? store.outer.residual_at(unit) : store.compression.residual_at(unit);
}

static std::string residual_name(int unit, bool outer) {
  return (outer ? "diloco_unit_" : "unit_") + std::to_string(unit);
}

void copy_part(ParamStore& store, const RankFilePart& p, float* dst) {
  // wherever the state lives: the device, or host memory or a file under optimizer offload
  store_state_read(store, p.unit, p.kind, p.range.first, p.range.size(), dst);
}

void copy_item(ParamStore& store, const RankFileContents& c, size_t i, float* dst) {
  if (i < c.parts.size()) return copy_part(store, c.parts[i], dst);
  const RankFileResidual& r = c.residuals[i - c.parts.size()];
  ops::copy_to_host(dst, residual_of(store, r.unit, r.outer), r.numel * sizeof(float));
}

static void write_part(hid_t file, const RankFilePart& p, const float* data) {
  const std::string name = unit_dataset(p.kind, p.unit);
  hsize_t n = p.range.size();
  H5Id space(ok(H5Screate_simple(1, &n, nullptr), "H5Screate_simple"));
  H5Id lcpl(link_props());
  H5Id ds(ok(H5Dcreate2(file, name.c_str(), H5T_IEEE_F32LE, space, lcpl, H5P_DEFAULT,
                        H5P_DEFAULT), "cannot create " + name));
  write_attr_i64(ds, "first", (int64_t)p.range.first);
  ok(H5Dwrite(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), "cannot write " + name);
}

// DiLoCo islands (K > 1) cut the dp group into islands of dp/K ranks, which changes the
// residuals' lengths and meaning at the same dp: K is named then (K = 1 is the plain layout).
// With int8 meetings (outer residuals) " diloco int8" follows. Under pp, the same degrees can
// put other blocks on this rank (pp_layers, pp_balance, the schedule's stage order), and a
// residual belongs to its block: the first tensor of each of this rank's units follows.
std::string residual_layout(const ParamStore& store, const GPTLayout& layout,
                            const MeshShape& s) {
  char text[200];
  int n = std::snprintf(text, sizeof(text), "%s dp %d tp %d pp %d pp_virtual %d cp %d ep %d zero %d",
                        grad_compression_name(store.compression.compressor.kind), s.dp, s.tp, s.pp,
                        s.pp_virtual, s.cp, s.ep, (int)store.mode);
  if (s.islands > 1) n += std::snprintf(text + n, sizeof(text) - n, " islands %d", s.islands);
  if (store.outer.compressed())
    std::snprintf(text + n, sizeof(text) - n, " diloco int8");
  std::string all = text;
  if (s.pp > 1) {
    all += " units";
    for (const ParamUnit& u : layout.units) all += " " + u.tensors.front().name;
  }
  return all;
}

// /residual/unit_<u> or /residual/diloco_unit_<u>: a whole residual of unit u (hdf5_format.h).
static void write_residual(hid_t group, const RankFileResidual& r, const float* data) {
  const std::string name = residual_name(r.unit, r.outer);
  hsize_t n = r.numel;
  H5Id space(ok(H5Screate_simple(1, &n, nullptr), "H5Screate_simple"));
  H5Id ds(ok(H5Dcreate2(group, name.c_str(), H5T_IEEE_F32LE, space, H5P_DEFAULT, H5P_DEFAULT,
                        H5P_DEFAULT), "cannot create residual/" + name));
  ok(H5Dwrite(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data),
     "cannot write residual/" + name);
}

std::string h5_write_rank_file(const std::string& path, const RankFileContents& c,
                               const PartSource& source, FileDigest* digest) {
  quiet_hdf5();
  try {
    H5Id file(create_in_memory(path, c.floats() * sizeof(float) + ((size_t)1 << 20)));
    if (c.writer >= 0) write_attr_i64(file, "writer", c.writer);
    if (c.step >= 0) write_attr_i64(file, "step", c.step);
    write_attr_i64(file, "shard_rank", c.shard_rank);
    write_attr_i64(file, "tp_rank", c.tp_rank);
    write_attr_i64(file, "pp_rank", c.pp_rank);
    write_attr_i64(file, "ep_rank", c.ep_rank);
    for (size_t i = 0; i < c.parts.size(); i++) write_part(file, c.parts[i], source(i));
    if (!c.residuals.empty()) {
      H5Id group(create_group(file, "residual"));
      write_string(group, "layout", c.residual_layout);
      for (size_t r = 0; r < c.residuals.size(); r++)
        write_residual(group, c.residuals[r], source(c.parts.size() + r));
    }
    return write_image(file, path, digest);
  } catch (const H5Failure& e) {
    return path + ": " + e.what();
  }
}

// A string dataset (write_string). Only the residuals' layout is read this way, from a rank
// file whose digest resume has already checked against the manifest.
static std::string read_string(hid_t file, const char* name) {
  H5Id ds(ok(H5Dopen2(file, name, H5P_DEFAULT), std::string("no dataset ") + name));
  H5Id type(utf8_string_type());
  H5Id space(ok(H5Dget_space(ds), "H5Dget_space"));
  char* p = nullptr;
  ok(H5Dread(ds, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, &p), std::string("cannot read ") + name);
  std::string text = p ? p : "";
  H5Dvlen_reclaim(type, space, H5P_DEFAULT, &p);
  return text;
}

// One residual dataset of `path` into the store (its length checked).
static void read_residual(hid_t group, const std::string& path, ParamStore& store, int unit,
                          bool outer, size_t numel) {
  const std::string name = residual_name(unit, outer);
  H5Id ds(ok(H5Dopen2(group, name.c_str(), H5P_DEFAULT), "no dataset residual/" + name));
  H5Id space(ok(H5Dget_space(ds), "H5Dget_space"));
  CHECK(H5Sget_simple_extent_npoints(space) == (hssize_t)numel,
        "%s: residual/%s has %lld values, expected %zu", path.c_str(), name.c_str(),
        (long long)H5Sget_simple_extent_npoints(space), numel);
  std::vector<float> host(numel);
  ok(H5Dread(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, host.data()),
     "cannot read residual/" + name);
  ops::copy_to_device(residual_of(store, unit, outer), host.data(), numel * sizeof(float));
}

std::string h5_read_residuals(const std::string& path, ParamStore& store,
                              const std::string& layout) {
  quiet_hdf5();
  try {
    H5Id file(ok(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), "cannot open"));
    if (H5Lexists(file, "residual", H5P_DEFAULT) <= 0) return "the checkpoint holds none";
    H5Id group(ok(H5Gopen2(file, "residual", H5P_DEFAULT), "cannot open residual"));
    const std::string written = read_string(group, "layout");
    if (written != layout) return "written under " + written + ", now " + layout;
    for (size_t u = 0; u < store.units.size(); u++) {
      if (store.compression.residual_at(u))
        read_residual(group, path, store, (int)u, false, store.compression.residual_numel_at(u));
      if (store.outer.residual_at(u))
        read_residual(group, path, store, (int)u, true, store.outer.residual_numel_at(u));
    }
  } catch (const H5Failure& e) {
    FATAL("cannot resume: %s: %s", path.c_str(), e.what());
  }
  return "";
}

std::string h5_write_rank_file(const std::string& path, ParamStore& store,
                               const GPTLayout& layout, const WriterShards& shards,
                               const MeshShape& shape, FileDigest* digest, int64_t writer,
                               int64_t step) {
  RankFileContents c = rank_file_contents(layout, shards, store, shape);
  c.writer = writer, c.step = step;
  size_t largest = 0;
  for (size_t i = 0; i < c.items(); i++) largest = std::max(largest, c.item_floats(i));
  std::vector<float> host(largest);
  return h5_write_rank_file(path, c, [&](size_t i) {
    copy_item(store, c, i, host.data());
    return (const float*)host.data();
  }, digest);
}

// Maps the blocks of tensor t that writer range wr holds into the virtual dataset; returns the
// number of elements mapped.
static size_t map_writer_part(hid_t dcpl, hid_t vspace, const TensorPlacement& t,
                              const FlatRange& wr, const std::string& source,
                              const std::string& source_dataset) {
  hsize_t src_len = wr.size();
  H5Id sspace(ok(H5Screate_simple(1, &src_len, nullptr), "H5Screate_simple"));
  size_t mapped = 0;
  for (const Block& b : blocks_in_range(t, wr)) {
    select_block(vspace, t, b);
    hsize_t sstart = b.local - wr.first, scount = b.numel();
    ok(H5Sselect_hyperslab(sspace, H5S_SELECT_SET, &sstart, nullptr, &scount, nullptr), "select");
    ok(H5Pset_virtual(dcpl, vspace, source.c_str(), source_dataset.c_str(), sspace),
       "H5Pset_virtual " + t.name);
    mapped += b.numel();
  }
  return mapped;
}

// Writer w's coordinates (hdf5_format.h): its place in dp x cp, its pp, tp and ep ranks.
struct WriterPlace {
  WriterShards shards;
  MeshCoords at;
};
static WriterPlace writer_place(int w, const CheckpointMeta& m) {
  const MeshShape shape = writer_shape(m);
  const MeshCoords at = mesh_coords(shape, w);
  const int per = shape.dp / shape.islands;  // dp ranks per island (all of them without)
  return {{at.dp % per * shape.cp + at.cp, per * shape.cp, shape.ep, at.dp / per}, at};
}
// The units it holds, among writer_units' (hdf5_format.h).
static const std::vector<ParamUnit>& units_of(const WriterUnits& units, const WriterPlace& wp,
                                              const CheckpointMeta& m) {
  return units[(wp.at.pp * m.writer_tp + wp.at.tp) * m.writer_ep + wp.at.ep];
}

// Where the writers of one island hold a logical tensor: (writer, local unit, tensor index) for
// each writer that saves part of it, keyed by name in the order the writers list them.
struct TensorSources {
  std::vector<std::string> names;
  std::map<std::string, std::vector<std::array<int, 3>>> parts;
};
static TensorSources tensor_sources(const WriterUnits& units, const CheckpointMeta& meta,
                                    int island) {
  TensorSources src;
  for (int w = 0; w < meta.writers; w++) {
    const WriterPlace wp = writer_place(w, meta);
    if (wp.shards.island != island) continue;
    const std::vector<ParamUnit>& held = units_of(units, wp, meta);
    for (size_t u = 0; u < held.size(); u++) {
      const FlatRange wr = writer_range(held[u], wp.shards, wp.at.tp);
      for (size_t i = 0; i < held[u].tensors.size(); i++) {
        const std::string& name = held[u].tensors[i].name;
        auto [it, added] = src.parts.try_emplace(name);
        if (added) src.names.push_back(name);
        if (!blocks_in_range(held[u].tensors[i], wr).empty())
          it->second.push_back({w, (int)u, (int)i});
      }
    }
  }
  return src;
}

// One logical tensor, as a virtual dataset over the files of the writers that hold it. Refuses a
// tensor whose elements the writers do not hold exactly once (a bug in the writer geometry).
static void write_virtual_tensor(hid_t file, const WriterUnits& units,
                                 const std::string& name,
                                 const std::vector<std::array<int, 3>>& parts, StateKind kind,
                                 const CheckpointMeta& meta, const std::string& prefix) {
  auto unit_of = [&](const std::array<int, 3>& p) -> const ParamUnit& {
    return units_of(units, writer_place(p[0], meta), meta)[p[1]];
  };
  const TensorPlacement& t = unit_of(parts.front()).tensors[parts.front()[2]];
  const std::vector<hsize_t> dims = dataset_dims(t);
  H5Id vspace(ok(H5Screate_simple((int)dims.size(), dims.data(), nullptr), "H5Screate_simple"));
  H5Id dcpl(ok(H5Pcreate(H5P_DATASET_CREATE), "H5Pcreate"));
  const float nan = NAN;
  ok(H5Pset_fill_value(dcpl, H5T_NATIVE_FLOAT, &nan), "H5Pset_fill_value");
  size_t mapped = 0;
  for (const std::array<int, 3>& p : parts) {
    const WriterPlace wp = writer_place(p[0], meta);
    const ParamUnit& pu = unit_of(p);
    const FlatRange wr = writer_range(pu, wp.shards, wp.at.tp);
    mapped += map_writer_part(dcpl, vspace, pu.tensors[p[2]], wr, rank_file_name(p[0]),
                              unit_dataset(kind, p[1]));
  }
  if (mapped != t.numel())
    throw H5Failure(name + ": the writers hold " + std::to_string(mapped) + " elements of its " +
                    std::to_string(t.numel()) + ", not each one once");
  ok(H5Sselect_all(vspace), "select");
  const std::string full = prefix + state_kind_name(kind) + "/" + name;
  H5Id lcpl(link_props());
  H5Id ds(ok(H5Dcreate2(file, full.c_str(), H5T_IEEE_F32LE, vspace, lcpl, dcpl, H5P_DEFAULT),
             "cannot create " + full));
}

static void write_meta(hid_t file, const CheckpointMeta& m) {
  write_attr_i64(file, "format_version", m.format_version);
  write_attr_i64(file, "step", m.step);
  write_attr_i64(file, "writers", m.writers);
  write_attr_i64(file, "writer_tp", m.writer_tp);
  write_attr_i64(file, "writer_cp", m.writer_cp);
  write_attr_i64(file, "writer_pp", m.writer_pp);
  write_attr_i64(file, "writer_pp_virtual", m.writer_pp_virtual);
  write_attr_i64(file, "writer_ep", m.writer_ep);
  if (m.islands > 0) write_attr_i64(file, "diloco_islands", m.islands);
  if (m.writer_dp_replicate > 1) write_attr_i64(file, "writer_dp_replicate", m.writer_dp_replicate);
  write_attr_i64(file, "writer_pp_order", m.writer_pp_order);
  if (!m.writer_pp_layers.empty()) write_attr_ints(file, "writer_pp_layers", m.writer_pp_layers);
  const std::pair<const char*, int> shape[] = {{"n_layer", m.L}, {"n_head", m.NH},
                                               {"d_model", m.C}, {"seq_len", m.T},
                                               {"vocab_size", m.V}, {"padded_vocab", m.Vp},
                                               {"max_seq_len", m.maxT}, {"n_experts", m.E},
                                               {"d_expert", m.d_expert},
                                               {"moe_every", m.moe_every}};
  for (const auto& kv : shape) write_attr_i64(file, kv.first, kv.second);
  if (m.n_shared > 0) write_attr_i64(file, "n_shared_experts", m.n_shared);
  if (m.llama) {
    const std::pair<const char*, int> arch[] = {{"llama", 1}, {"n_kv_head", m.NKV},
                                                {"d_ff", m.F}, {"tie_embeddings", m.tied}};
    for (const auto& kv : arch) write_attr_i64(file, kv.first, kv.second);
  }
  write_string(file, "config", m.config_toml);
  H5Id rng(create_group(file, "rng"));
  {  // the seed is a uint64: stored as such
    H5Id space(ok(H5Screate(H5S_SCALAR), "H5Screate"));
    H5Id attr(ok(H5Acreate2(rng, "seed", H5T_STD_U64LE, space, H5P_DEFAULT, H5P_DEFAULT),
                 "cannot create rng/seed"));
    ok(H5Awrite(attr, H5T_NATIVE_UINT64, &m.seed), "cannot write rng/seed");
  }
  H5Id data(create_group(file, "data"));
  write_attr_i64(data, "epoch", m.data.epoch);
  write_attr_i64(data, "shard", m.data.shard);
  write_attr_i64(data, "row", m.data.row);
  H5Id train(create_group(file, "train"));
  write_attr_f64(train, "loss_mean", m.loss_trend.mean);
  write_attr_f64(train, "loss_var", m.loss_trend.var);
  write_attr_i64(train, "applied", m.loss_trend.applied);
  write_attr_i64(train, "skipped", m.loss_trend.skipped);
  write_attr_i64(train, "skipped_in_a_row", m.loss_trend.skipped_in_a_row);
  if (!m.moe_bias.empty()) write_attr_floats(train, "moe_bias", m.moe_bias);
}

std::string h5_write_index(const std::string& path, const WriterUnits& units,
                           const CheckpointMeta& meta, FileDigest* digest) {
  quiet_hdf5();
  try {
    H5Id file(create_in_memory(path, (size_t)1 << 20));
    write_meta(file, meta);
    for (int island = 0; island < std::max(1, meta.islands); island++) {
      const TensorSources src = tensor_sources(units, meta, island);
      for (StateKind kind : kAllKinds) {
        if (is_outer_state(kind) && (meta.islands == 0 || island > 0)) continue;
        for (const std::string& name : src.names) {
          const auto it = src.parts.find(name);
          if (it == src.parts.end() || it->second.empty())
            throw H5Failure("no writer holds " + name);
          write_virtual_tensor(file, units, name, it->second, kind, meta,
                               is_outer_state(kind) ? "" : island_prefix(island));
        }
      }
    }
    return write_image(file, path, digest);
  } catch (const H5Failure& e) {
    return path + ": " + e.what();
  }
}

// "step_000123" -> 123, else -1 (a checkpoint directory renamed by hand is not checked).
static int64_t step_of_dir_name(const std::string& name) {
  if (name.size() <= 5 || name.compare(0, 5, "step_") != 0 ||
      name.find_first_not_of("0123456789", 5) != std::string::npos || name.size() > 20)
    return -1;
  return std::stoll(name.substr(5));
}

std::string h5_check_rank_files(const std::string& ckpt, const CheckpointMeta& meta, int offset,
                                int stride) {
  const int64_t named = step_of_dir_name(base_name(ckpt));
  if (named >= 0 && named != meta.step)
    return ckpt + "/" + kIndexFileName + " was written at step " + std::to_string(meta.step) +
           ", but sits in the checkpoint of step " + std::to_string(named);
  quiet_hdf5();
  for (int w = offset; w < meta.writers; w += stride) {
    const std::string path = ckpt + "/" + rank_file_name(w);
    try {
      H5Id file(ok(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), "cannot open"));
      const int64_t writer = read_attr_or(file, "writer", w);
      const int64_t step = read_attr_or(file, "step", meta.step);
      if (writer != w)
        return path + " was written by rank " + std::to_string(writer) + ", but sits in the "
               "place of rank " + std::to_string(w) + " (files swapped or renamed)";
      if (step != meta.step)
        return path + " was written at step " + std::to_string(step) + ", but sits in the "
               "checkpoint of step " + std::to_string(meta.step) + " (" + ckpt + ")";
    } catch (const H5Failure& e) {
      return path + ": " + e.what();
    }
  }
  return "";
}
