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

FlatRange writer_range(size_t unit_numel, int writer, int writers) {
  const size_t slice = round_up(unit_numel, (size_t)writers * kTensorAlign) / writers;
  FlatRange r;
  r.first = std::min(unit_numel, (size_t)writer * slice);
  r.end = std::min(unit_numel, r.first + slice);
  return r;
}

std::vector<RowPiece> flat_range_pieces(size_t first, size_t count, size_t width) {
  std::vector<RowPiece> pieces;
  size_t at = first;
  const size_t end = first + count;
  if (at < end && at % width != 0) {  // partial first row
    const size_t n = std::min(width - at % width, end - at);
    pieces.push_back({at / width, at % width, 1, n, at});
    at += n;
  }
  if (end - at >= width) {  // full rows
    const size_t rows = (end - at) / width;
    pieces.push_back({at / width, 0, rows, width, at});
    at += rows * width;
  }
  if (at < end) pieces.push_back({at / width, 0, 1, end - at, at});  // partial last row
  return pieces;
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
  const UnitState& us = store.units[u];
  CHECK(range.first >= us.shard_offset && range.end <= us.shard_offset + us.shard_numel,
        "checkpoint: unit %zu range [%zu, %zu) is not inside this rank's shard [%zu, %zu)", u,
        range.first, range.end, us.shard_offset, us.shard_offset + us.shard_numel);
  const float* src = store_state(store, (int)u, kind) + (range.first - us.shard_offset);
  ops::copy_to_host(host.data(), src, range.size() * sizeof(float));
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
                               const GPTLayout& layout, int writer, int writers) {
  quiet_hdf5();
  try {
    H5Id file(ok(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT),
                 "cannot create"));
    write_attr_i64(file, "writer", writer);
    write_attr_i64(file, "writers", writers);
    size_t largest = 0;
    for (const ParamUnit& pu : layout.units)
      largest = std::max(largest, writer_range(pu.numel, writer, writers).size());
    std::vector<float> host(largest);
    for (StateKind kind : kAllKinds)
      for (size_t u = 0; u < layout.units.size(); u++) {
        const FlatRange range = writer_range(layout.units[u].numel, writer, writers);
        if (range.size() > 0) write_unit_range(file, store, u, kind, range, host);
      }
    close_file(file, path);
  } catch (const H5Failure& e) {
    return path + ": " + e.what();
  }
  return "";
}

// Maps writer w's part of tensor t (flat range [a, b) of the unit) into the virtual dataset.
static void map_writer_part(hid_t dcpl, hid_t vspace, int rank, const ParamTensor& t,
                            const FlatRange& wr, size_t a, size_t b, const std::string& source,
                            const std::string& source_dataset) {
  hsize_t src_len = wr.size();
  H5Id sspace(ok(H5Screate_simple(1, &src_len, nullptr), "H5Screate_simple"));
  for (const RowPiece& p : flat_range_pieces(a - t.offset, b - a, (size_t)t.cols)) {
    if (rank == 2) {
      hsize_t start[2] = {p.row, p.col}, count[2] = {p.rows, p.cols};
      ok(H5Sselect_hyperslab(vspace, H5S_SELECT_SET, start, nullptr, count, nullptr), "select");
    } else {
      hsize_t start = p.flat, count = p.rows * p.cols;
      ok(H5Sselect_hyperslab(vspace, H5S_SELECT_SET, &start, nullptr, &count, nullptr), "select");
    }
    hsize_t sstart = t.offset + p.flat - wr.first, scount = p.rows * p.cols;
    ok(H5Sselect_hyperslab(sspace, H5S_SELECT_SET, &sstart, nullptr, &scount, nullptr), "select");
    ok(H5Pset_virtual(dcpl, vspace, source.c_str(), source_dataset.c_str(), sspace),
       "H5Pset_virtual " + t.name);
  }
}

static void write_virtual_tensor(hid_t file, const ParamTensor& t, size_t u, size_t unit_numel,
                                 StateKind kind, int writers) {
  const int rank = t.cols == 1 ? 1 : 2;
  hsize_t dims[2] = {(hsize_t)t.rows, (hsize_t)t.cols};
  H5Id vspace(ok(H5Screate_simple(rank, dims, nullptr), "H5Screate_simple"));
  H5Id dcpl(ok(H5Pcreate(H5P_DATASET_CREATE), "H5Pcreate"));
  const float nan = NAN;
  ok(H5Pset_fill_value(dcpl, H5T_NATIVE_FLOAT, &nan), "H5Pset_fill_value");
  for (int w = 0; w < writers; w++) {
    const FlatRange wr = writer_range(unit_numel, w, writers);
    const size_t a = std::max(wr.first, t.offset), b = std::min(wr.end, t.offset + t.numel());
    if (a < b)
      map_writer_part(dcpl, vspace, rank, t, wr, a, b, rank_file_name(w), unit_dataset(kind, u));
  }
  ok(H5Sselect_all(vspace), "select");
  const std::string name = std::string(state_kind_name(kind)) + "/" + t.name;
  H5Id lcpl(link_props());
  H5Id ds(ok(H5Dcreate2(file, name.c_str(), H5T_IEEE_F32LE, vspace, lcpl, dcpl, H5P_DEFAULT),
             "cannot create " + name));
}

static void write_meta(hid_t file, const CheckpointMeta& m) {
  write_attr_i64(file, "format_version", m.format_version);
  write_attr_i64(file, "step", m.step);
  write_attr_i64(file, "writers", m.writers);
  const std::pair<const char*, int> shape[] = {{"n_layer", m.L}, {"n_head", m.NH},
                                               {"d_model", m.C}, {"seq_len", m.T},
                                               {"vocab_size", m.V}, {"padded_vocab", m.Vp}};
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

std::string h5_write_index(const std::string& path, const GPTLayout& layout,
                           const CheckpointMeta& meta) {
  quiet_hdf5();
  try {
    H5Id file(ok(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT),
                 "cannot create"));
    write_meta(file, meta);
    for (StateKind kind : kAllKinds)
      for (size_t u = 0; u < layout.units.size(); u++)
        for (const ParamTensor& t : layout.units[u].tensors)
          write_virtual_tensor(file, t, u, layout.units[u].numel, kind, meta.writers);
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
    if (m->format_version != kCheckpointFormatVersion)
      return path + ": format version " + std::to_string(m->format_version) +
             ", this trainer reads version " + std::to_string(kCheckpointFormatVersion);
    m->step = read_attr_i64(file, "step");
    m->writers = (int)read_attr_i64(file, "writers");
    int* shape[] = {&m->L, &m->NH, &m->C, &m->T, &m->V, &m->Vp};
    const char* names[] = {"n_layer", "n_head", "d_model", "seq_len", "vocab_size",
                           "padded_vocab"};
    for (int i = 0; i < 6; i++) *shape[i] = (int)read_attr_i64(file, names[i]);
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

// Reads elements [first, first + count) of the logical tensor behind `ds` into dst.
static void read_flat_range(hid_t ds, const ParamTensor& t, size_t first, size_t count,
                            float* dst) {
  H5Id fspace(ok(H5Dget_space(ds), "H5Dget_space"));
  const int rank = ok(H5Sget_simple_extent_ndims(fspace), "H5Sget_simple_extent_ndims");
  hsize_t dims[2] = {0, 1};
  ok(H5Sget_simple_extent_dims(fspace, dims, nullptr), "H5Sget_simple_extent_dims");
  const int64_t cols = rank == 2 ? (int64_t)dims[1] : 1;
  if (rank < 1 || rank > 2 || (int64_t)dims[0] != t.rows || cols != t.cols)
    throw H5Failure("has shape (" + std::to_string(dims[0]) +
                    (rank == 2 ? ", " + std::to_string(dims[1]) : std::string()) +
                    "), the model's tensor is (" + std::to_string(t.rows) + ", " +
                    std::to_string(t.cols) + ")");
  for (const RowPiece& p : flat_range_pieces(first, count, (size_t)t.cols)) {
    hsize_t n = p.rows * p.cols;
    if (rank == 2) {
      hsize_t start[2] = {p.row, p.col}, cnt[2] = {p.rows, p.cols};
      ok(H5Sselect_hyperslab(fspace, H5S_SELECT_SET, start, nullptr, cnt, nullptr), "select");
    } else {
      hsize_t start = p.flat;
      ok(H5Sselect_hyperslab(fspace, H5S_SELECT_SET, &start, nullptr, &n, nullptr), "select");
    }
    H5Id mspace(ok(H5Screate_simple(1, &n, nullptr), "H5Screate_simple"));
    ok(H5Dread(ds, H5T_NATIVE_FLOAT, mspace, fspace, H5P_DEFAULT, dst + (p.flat - first)),
       "cannot read");
  }
}

ParamFill h5_index_fill(const CheckpointIndex& index, StateKind kind) {
  const hid_t file = index.file;
  const std::string path = index.path;
  return [file, path, kind](const ParamTensor& t, size_t first, size_t count, float* dst) {
    const std::string name = std::string(state_kind_name(kind)) + "/" + t.name;
    try {
      H5Id ds(ok(H5Dopen2(file, name.c_str(), H5P_DEFAULT), "no such dataset"));
      read_flat_range(ds, t, first, count, dst);
    } catch (const H5Failure& e) {
      FATAL("checkpoint %s: /%s: %s", path.c_str(), name.c_str(), e.what());
    }
  };
}
