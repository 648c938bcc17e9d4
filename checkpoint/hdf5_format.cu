// checkpoint/hdf5_format.cu - the HDF5 side of checkpoints: rank files, the virtual-dataset
// index, and reading any flat range of any logical tensor back. See checkpoint/hdf5_format.h.
//
// Every file here is opened by one process with HDF5's default (POSIX) driver: no MPI-IO, no
// collective metadata. HDF5 errors are turned into C++ exceptions inside this file (one helper,
// `ok`, checks every call and takes the innermost message off HDF5's error stack) and into
// returned messages at its edges, so that a rank whose disk is full can report it and let the
// ranks agree, instead of dying alone in the middle of a save. The library's own printing of
// error stacks is switched off (a process-wide HDF5 setting) for the same reason.
#include "checkpoint/hdf5_format.h"

#include <hdf5.h>

#include <algorithm>
#include <array>
#include <map>
#include <cmath>
#include <stdexcept>

#include "kernels/ops.h"

static_assert(sizeof(hid_t) == sizeof(int64_t), "CheckpointIndex keeps a hid_t in an int64_t");

const char* const kIndexFileName = "checkpoint.h5";

std::string rank_file_name(int writer) {
  char name[32];
  std::snprintf(name, sizeof(name), "rank_%05d.h5", writer);
  return name;
}

FlatRange writer_range(const ParamUnit& u, const WriterShards& s, int tp_rank) {
  const bool experts = u.grad_axis == Axis::EPDP;  // held by the ranks of one ep rank only
  const int rank = experts ? s.index / s.ep : s.index, ranks = experts ? s.count / s.ep : s.count;
  return clip(shard_range(u.numel, rank, ranks), owned_end(u, tp_rank));
}

MeshShape writer_shape(const CheckpointMeta& m) {
  MeshShape shape;
  shape.tp = m.writer_tp, shape.cp = m.writer_cp, shape.pp = m.writer_pp, shape.ep = m.writer_ep;
  shape.pp_virtual = m.writer_pp_virtual;
  shape.pp_order = m.writer_pp_order == 1 ? StageOrder::V : StageOrder::Loop;
  shape.pp_layers = m.writer_pp_layers;
  shape.dp = m.writers / (shape.tp * shape.cp * shape.pp);
  return shape;
}

// A writer's local layout depends on its pp, tp and ep coordinates only; each is laid out over a
// described mesh (parallel/mesh.h) with the writers' degrees, at a rank with those coordinates.
WriterUnits writer_units(const ModelConfig& model, const MeshShape& writers) {
  MeshShape shape = writers;
  shape.dp = writers.ep;  // enough dp x cp positions for every ep rank; dp changes no layout
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
// HDF5 plumbing: errors as exceptions, identifiers closed by scope
// ---------------------------------------------------------------------------------------------
namespace {

struct H5Failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

herr_t keep_innermost(unsigned n, const H5E_error2_t* e, void* out) {
  std::string* s = (std::string*)out;
  if (s->empty() && e->desc) *s = e->desc;
  return 0;
}

std::string hdf5_message() {
  std::string s;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, keep_innermost, &s);
  H5Eclear2(H5E_DEFAULT);
  return s.empty() ? "HDF5 error" : s;
}

template <class T>
T ok(T result, const std::string& what) {
  if (result < 0) throw H5Failure(what + ": " + hdf5_message());
  return result;
}

void quiet_hdf5() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

// An HDF5 identifier released when it goes out of scope (H5Idec_ref closes any kind).
class H5Id {
 public:
  explicit H5Id(hid_t id = -1) : id_(id) {}
  H5Id(const H5Id&) = delete;
  H5Id& operator=(const H5Id&) = delete;
  ~H5Id() {
    if (id_ >= 0) H5Idec_ref(id_);
  }
  operator hid_t() const { return id_; }
  hid_t release() {
    hid_t id = id_;
    id_ = -1;
    return id;
  }

 private:
  hid_t id_;
};

// Files are closed explicitly: a failed close (the last flush) must be seen.
void close_file(H5Id& file, const std::string& path) {
  ok(H5Fclose(file.release()), "cannot close " + path);
}

hid_t link_props() {  // "create missing parent groups" for paths like model/h.3/attn/qkv/weight
  hid_t lcpl = ok(H5Pcreate(H5P_LINK_CREATE), "H5Pcreate");
  ok(H5Pset_create_intermediate_group(lcpl, 1), "H5Pset_create_intermediate_group");
  return lcpl;
}

void write_attr_i64(hid_t obj, const char* name, int64_t value) {
  H5Id space(ok(H5Screate(H5S_SCALAR), "H5Screate"));
  H5Id attr(ok(H5Acreate2(obj, name, H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT),
               std::string("cannot create attribute ") + name));
  ok(H5Awrite(attr, H5T_NATIVE_INT64, &value), std::string("cannot write attribute ") + name);
}

int64_t read_attr_i64(hid_t obj, const char* name) {
  H5Id attr(ok(H5Aopen(obj, name, H5P_DEFAULT), std::string("no attribute ") + name));
  int64_t value = 0;
  ok(H5Aread(attr, H5T_NATIVE_INT64, &value), std::string("cannot read attribute ") + name);
  return value;
}

// An attribute that older checkpoints lack: `absent` stands for it there.
int64_t read_attr_or(hid_t obj, const char* name, int64_t absent) {
  return H5Aexists(obj, name) > 0 ? read_attr_i64(obj, name) : absent;
}

// A list of integers (the stages' block counts); an absent one reads as empty.
void write_attr_ints(hid_t obj, const char* name, const std::vector<int>& values) {
  const hsize_t n = values.size();
  std::vector<int64_t> v(values.begin(), values.end());
  H5Id space(ok(H5Screate_simple(1, &n, nullptr), "H5Screate_simple"));
  H5Id attr(ok(H5Acreate2(obj, name, H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT),
               std::string("cannot create attribute ") + name));
  ok(H5Awrite(attr, H5T_NATIVE_INT64, v.data()), std::string("cannot write attribute ") + name);
}

std::vector<int> read_attr_ints_or_empty(hid_t obj, const char* name) {
  if (H5Aexists(obj, name) <= 0) return {};
  H5Id attr(ok(H5Aopen(obj, name, H5P_DEFAULT), std::string("no attribute ") + name));
  H5Id space(ok(H5Aget_space(attr), "H5Aget_space"));
  std::vector<int64_t> v((size_t)H5Sget_simple_extent_npoints(space));
  ok(H5Aread(attr, H5T_NATIVE_INT64, v.data()), std::string("cannot read attribute ") + name);
  return std::vector<int>(v.begin(), v.end());
}

hid_t utf8_string_type() {
  hid_t t = ok(H5Tcopy(H5T_C_S1), "H5Tcopy");
  ok(H5Tset_size(t, H5T_VARIABLE), "H5Tset_size");
  ok(H5Tset_cset(t, H5T_CSET_UTF8), "H5Tset_cset");
  return t;
}

void write_string(hid_t file, const char* name, const std::string& text) {
  H5Id type(utf8_string_type());
  H5Id space(ok(H5Screate(H5S_SCALAR), "H5Screate"));
  H5Id ds(ok(H5Dcreate2(file, name, type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
             std::string("cannot create ") + name));
  const char* p = text.c_str();
  ok(H5Dwrite(ds, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, &p), std::string("cannot write ") + name);
}

std::string read_string(hid_t file, const char* name) {
  H5Id ds(ok(H5Dopen2(file, name, H5P_DEFAULT), std::string("no dataset ") + name));
  H5Id type(utf8_string_type());
  H5Id space(ok(H5Dget_space(ds), "H5Dget_space"));
  char* p = nullptr;
  ok(H5Dread(ds, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, &p), std::string("cannot read ") + name);
  std::string text = p ? p : "";
  H5Dvlen_reclaim(type, space, H5P_DEFAULT, &p);
  return text;
}

hid_t create_group(hid_t parent, const char* name) {
  H5Id lcpl(link_props());
  return ok(H5Gcreate2(parent, name, lcpl, H5P_DEFAULT, H5P_DEFAULT),
            std::string("cannot create group ") + name);
}

std::string unit_dataset(StateKind kind, size_t unit) {
  return std::string(state_kind_name(kind)) + "/unit_" + std::to_string(unit);
}

const StateKind kAllKinds[] = {StateKind::Master, StateKind::AdamM, StateKind::AdamV};

}  // namespace

// ---------------------------------------------------------------------------------------------
// Writing
// ---------------------------------------------------------------------------------------------
static void write_unit_range(hid_t file, ParamStore& store, size_t u, StateKind kind,
                             const FlatRange& range, std::vector<float>& host) {
  // wherever the state lives: the device, or host memory or a file under optimizer offload
  store_state_read(store, (int)u, kind, range.first, range.size(), host.data());
  const std::string name = unit_dataset(kind, u);
  hsize_t n = range.size();
  H5Id space(ok(H5Screate_simple(1, &n, nullptr), "H5Screate_simple"));
  H5Id lcpl(link_props());
  H5Id ds(ok(H5Dcreate2(file, name.c_str(), H5T_IEEE_F32LE, space, lcpl, H5P_DEFAULT,
                        H5P_DEFAULT), "cannot create " + name));
  write_attr_i64(ds, "first", (int64_t)range.first);
  ok(H5Dwrite(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, host.data()),
     "cannot write " + name);
}

std::string h5_write_rank_file(const std::string& path, ParamStore& store,
                               const GPTLayout& layout, const WriterShards& shards) {
  quiet_hdf5();
  try {
    H5Id file(ok(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT),
                 "cannot create"));
    write_attr_i64(file, "shard_rank", shards.index);
    write_attr_i64(file, "tp_rank", layout.tp.rank());
    write_attr_i64(file, "pp_rank", layout.pp.rank());
    write_attr_i64(file, "ep_rank", layout.ep->rank);
    const int tp_rank = layout.tp.rank();
    size_t largest = 0;
    for (const ParamUnit& pu : layout.units)
      largest = std::max(largest, writer_range(pu, shards, tp_rank).size());
    std::vector<float> host(largest);
    for (StateKind kind : kAllKinds)
      for (size_t u = 0; u < layout.units.size(); u++) {
        const FlatRange range = writer_range(layout.units[u], shards, tp_rank);
        if (range.size() > 0) write_unit_range(file, store, u, kind, range, host);
      }
    close_file(file, path);
  } catch (const H5Failure& e) {
    return path + ": " + e.what();
  }
  return "";
}

// The dataset shape of logical tensor t (hdf5_format.h): (rows, cols), (rows,) for a vector, and
// a leading experts axis for a stacked tensor: (E, rows/E, cols), (E, rows/E).
static std::vector<hsize_t> dataset_dims(const TensorPlacement& t) {
  std::vector<hsize_t> dims;
  if (t.stacked > 1) dims.push_back((hsize_t)t.stacked);
  dims.push_back((hsize_t)(t.rows / t.stacked));
  if (t.cols > 1) dims.push_back((hsize_t)t.cols);
  return dims;
}

static std::string shape_text(const std::vector<hsize_t>& dims) {
  std::string s = "(";
  for (size_t i = 0; i < dims.size(); i++) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + ")";
}

// Selects block b of logical tensor t in `space` (shaped as dataset_dims(t)): global row b.row
// of a stacked tensor is row b.row % (rows/E) of expert b.row / (rows/E).
static void select_block(hid_t space, const TensorPlacement& t, const Block& b) {
  const int64_t per = t.rows / t.stacked;  // rows per expert (all of them when not stacked)
  CHECK(b.row % per + b.rows <= per, "%s: block of rows [%lld, %lld) crosses an expert",
        t.name.c_str(), (long long)b.row, (long long)(b.row + b.rows));
  std::vector<hsize_t> start, count;
  if (t.stacked > 1) start.push_back((hsize_t)(b.row / per)), count.push_back(1);
  start.push_back((hsize_t)(b.row % per)), count.push_back((hsize_t)b.rows);
  if (t.cols > 1) start.push_back((hsize_t)b.col), count.push_back((hsize_t)b.cols);
  ok(H5Sselect_hyperslab(space, H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr),
     "select");
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
  return {{at.dp * shape.cp + at.cp, shape.dp * shape.cp, shape.ep}, at};
}
// The units it holds, among writer_units' (hdf5_format.h).
static const std::vector<ParamUnit>& units_of(const WriterUnits& units, const WriterPlace& wp,
                                              const CheckpointMeta& m) {
  return units[(wp.at.pp * m.writer_tp + wp.at.tp) * m.writer_ep + wp.at.ep];
}

// Where the writers hold a logical tensor: (writer, local unit, tensor index) for each writer
// that saves part of it, keyed by name in the order the writers list them.
struct TensorSources {
  std::vector<std::string> names;
  std::map<std::string, std::vector<std::array<int, 3>>> parts;
};
static TensorSources tensor_sources(const WriterUnits& units, const CheckpointMeta& meta) {
  TensorSources src;
  for (int w = 0; w < meta.writers; w++) {
    const WriterPlace wp = writer_place(w, meta);
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
                                 const CheckpointMeta& meta) {
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
  const std::string full = std::string(state_kind_name(kind)) + "/" + name;
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
  write_attr_i64(file, "writer_pp_order", m.writer_pp_order);
  if (!m.writer_pp_layers.empty()) write_attr_ints(file, "writer_pp_layers", m.writer_pp_layers);
  const std::pair<const char*, int> shape[] = {{"n_layer", m.L}, {"n_head", m.NH},
                                               {"d_model", m.C}, {"seq_len", m.T},
                                               {"vocab_size", m.V}, {"padded_vocab", m.Vp},
                                               {"max_seq_len", m.maxT}, {"n_experts", m.E},
                                               {"d_expert", m.d_expert},
                                               {"moe_every", m.moe_every}};
  for (const auto& kv : shape) write_attr_i64(file, kv.first, kv.second);
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
}

std::string h5_write_index(const std::string& path, const WriterUnits& units,
                           const CheckpointMeta& meta) {
  quiet_hdf5();
  try {
    H5Id file(ok(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT),
                 "cannot create"));
    write_meta(file, meta);
    const TensorSources src = tensor_sources(units, meta);
    for (StateKind kind : kAllKinds)
      for (const std::string& name : src.names) {
        const auto it = src.parts.find(name);
        if (it == src.parts.end() || it->second.empty())
          throw H5Failure("no writer holds " + name);
        write_virtual_tensor(file, units, name, it->second, kind, meta);
      }
    close_file(file, path);
  } catch (const H5Failure& e) {
    return path + ": " + e.what();
  }
  return "";
}

// ---------------------------------------------------------------------------------------------
// Reading
// ---------------------------------------------------------------------------------------------
std::string h5_open_index(const std::string& path, CheckpointIndex* index, CheckpointMeta* m) {
  quiet_hdf5();
  try {
    H5Id file(ok(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), "cannot open"));
    m->format_version = (int)read_attr_i64(file, "format_version");
    if (m->format_version < kCheckpointFormatDense || m->format_version > kCheckpointFormatMoe)
      return path + ": format version " + std::to_string(m->format_version) +
             ", this trainer reads versions " + std::to_string(kCheckpointFormatDense) + " to " +
             std::to_string(kCheckpointFormatMoe);
    m->step = read_attr_i64(file, "step");
    m->writers = (int)read_attr_i64(file, "writers");
    m->writer_tp = (int)read_attr_or(file, "writer_tp", 1);
    m->writer_pp = (int)read_attr_or(file, "writer_pp", 1);
    m->writer_cp = (int)read_attr_or(file, "writer_cp", 1);
    m->writer_pp_virtual = (int)read_attr_or(file, "writer_pp_virtual", 1);
    m->writer_ep = (int)read_attr_or(file, "writer_ep", 1);
    m->writer_pp_order = (int)read_attr_or(file, "writer_pp_order", 0);
    m->writer_pp_layers = read_attr_ints_or_empty(file, "writer_pp_layers");
    m->E = (int)read_attr_or(file, "n_experts", 0);
    m->d_expert = (int)read_attr_or(file, "d_expert", 0);
    m->moe_every = (int)read_attr_or(file, "moe_every", 0);
    int* shape[] = {&m->L, &m->NH, &m->C, &m->T, &m->V, &m->Vp};
    const char* names[] = {"n_layer", "n_head", "d_model", "seq_len", "vocab_size",
                           "padded_vocab"};
    for (int i = 0; i < 6; i++) *shape[i] = (int)read_attr_i64(file, names[i]);
    m->maxT = (int)read_attr_or(file, "max_seq_len", m->T);
    m->config_toml = read_string(file, "config");
    H5Id rng(ok(H5Gopen2(file, "rng", H5P_DEFAULT), "no group rng"));
    H5Id seed(ok(H5Aopen(rng, "seed", H5P_DEFAULT), "no attribute rng/seed"));
    ok(H5Aread(seed, H5T_NATIVE_UINT64, &m->seed), "cannot read rng/seed");
    H5Id data(ok(H5Gopen2(file, "data", H5P_DEFAULT), "no group data"));
    m->data.epoch = read_attr_i64(data, "epoch");
    m->data.shard = read_attr_i64(data, "shard");
    m->data.row = read_attr_i64(data, "row");
    index->file = file.release();
    index->path = path;
  } catch (const H5Failure& e) {
    return path + ": " + e.what();
  }
  return "";
}

void h5_close_index(CheckpointIndex& index) {
  if (index.file >= 0) H5Fclose(index.file);
  index.file = -1;
}

// Reads block b of the logical tensor behind `ds` into dst (b.rows x b.cols, row-major).
static void read_block(hid_t ds, const TensorPlacement& t, const Block& b, float* dst) {
  H5Id fspace(ok(H5Dget_space(ds), "H5Dget_space"));
  const int rank = ok(H5Sget_simple_extent_ndims(fspace), "H5Sget_simple_extent_ndims");
  std::vector<hsize_t> dims(rank);
  ok(H5Sget_simple_extent_dims(fspace, dims.data(), nullptr), "H5Sget_simple_extent_dims");
  if (dims != dataset_dims(t))
    throw H5Failure("has shape " + shape_text(dims) + ", the model's tensor is " +
                    shape_text(dataset_dims(t)));
  select_block(fspace, t, b);
  hsize_t n = b.numel();
  H5Id mspace(ok(H5Screate_simple(1, &n, nullptr), "H5Screate_simple"));
  ok(H5Dread(ds, H5T_NATIVE_FLOAT, mspace, fspace, H5P_DEFAULT, dst), "cannot read");
}

ParamFill h5_index_fill(const CheckpointIndex& index, StateKind kind) {
  const hid_t file = index.file;
  const std::string path = index.path;
  return [file, path, kind](const TensorPlacement& t, const Block& b, float* dst) {
    const std::string name = std::string(state_kind_name(kind)) + "/" + t.name;
    try {
      H5Id ds(ok(H5Dopen2(file, name.c_str(), H5P_DEFAULT), "no such dataset"));
      read_block(ds, t, b, dst);
    } catch (const H5Failure& e) {
      FATAL("checkpoint %s: /%s: %s", path.c_str(), name.c_str(), e.what());
    }
  };
}
