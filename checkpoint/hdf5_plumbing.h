// checkpoint/hdf5_plumbing.h - what the two HDF5 files of the checkpoint share
// (checkpoint/hdf5_format.cu writes, checkpoint/hdf5_read.cu reads; nothing else includes it):
// HDF5 errors as C++ exceptions (`ok` checks every call and takes the innermost message off
// HDF5's error stack; the library's own printing is switched off, a process-wide setting),
// identifiers closed by scope, attributes and strings, and where a block of a logical tensor
// lies in its dataset.
#pragma once
#include <hdf5.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/common.h"
#include "parallel/param_store.h"
#include "parallel/placement.h"

namespace h5 {

struct H5Failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

inline herr_t keep_innermost(unsigned n, const H5E_error2_t* e, void* out) {
  std::string* s = (std::string*)out;
  if (s->empty() && e->desc) *s = e->desc;
  return 0;
}

inline std::string hdf5_message() {
  std::string s;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, keep_innermost, &s);
  H5Eclear2(H5E_DEFAULT);
  return s.empty() ? "HDF5 error" : s;
}

template <class T>
inline T ok(T result, const std::string& what) {
  if (result < 0) throw H5Failure(what + ": " + hdf5_message());
  return result;
}

inline void quiet_hdf5() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

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

// "Create missing parent groups", for paths like model/h.3/attn/qkv/weight.
inline hid_t link_props() {
  hid_t lcpl = ok(H5Pcreate(H5P_LINK_CREATE), "H5Pcreate");
  ok(H5Pset_create_intermediate_group(lcpl, 1), "H5Pset_create_intermediate_group");
  return lcpl;
}

inline void write_attr_i64(hid_t obj, const char* name, int64_t value) {
  H5Id space(ok(H5Screate(H5S_SCALAR), "H5Screate"));
  H5Id attr(ok(H5Acreate2(obj, name, H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT),
               std::string("cannot create attribute ") + name));
  ok(H5Awrite(attr, H5T_NATIVE_INT64, &value), std::string("cannot write attribute ") + name);
}

inline void write_attr_f64(hid_t obj, const char* name, double value) {
  H5Id space(ok(H5Screate(H5S_SCALAR), "H5Screate"));
  H5Id attr(ok(H5Acreate2(obj, name, H5T_IEEE_F64LE, space, H5P_DEFAULT, H5P_DEFAULT),
               std::string("cannot create attribute ") + name));
  ok(H5Awrite(attr, H5T_NATIVE_DOUBLE, &value), std::string("cannot write attribute ") + name);
}

inline double read_attr_f64(hid_t obj, const char* name) {
  H5Id attr(ok(H5Aopen(obj, name, H5P_DEFAULT), std::string("no attribute ") + name));
  double value = 0;
  ok(H5Aread(attr, H5T_NATIVE_DOUBLE, &value), std::string("cannot read attribute ") + name);
  return value;
}

inline int64_t read_attr_i64(hid_t obj, const char* name) {
  H5Id attr(ok(H5Aopen(obj, name, H5P_DEFAULT), std::string("no attribute ") + name));
  int64_t value = 0;
  ok(H5Aread(attr, H5T_NATIVE_INT64, &value), std::string("cannot read attribute ") + name);
  return value;
}

// An attribute that older checkpoints lack: `absent` stands for it there.
inline int64_t read_attr_or(hid_t obj, const char* name, int64_t absent) {
  return H5Aexists(obj, name) > 0 ? read_attr_i64(obj, name) : absent;
}

// A list of integers (the pipeline stages' block counts); an absent one reads as empty.
inline void write_attr_ints(hid_t obj, const char* name, const std::vector<int>& values) {
  const hsize_t n = values.size();
  std::vector<int64_t> v(values.begin(), values.end());
  H5Id space(ok(H5Screate_simple(1, &n, nullptr), "H5Screate_simple"));
  H5Id attr(ok(H5Acreate2(obj, name, H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT),
               std::string("cannot create attribute ") + name));
  ok(H5Awrite(attr, H5T_NATIVE_INT64, v.data()), std::string("cannot write attribute ") + name);
}

inline std::vector<int> read_attr_ints_or_empty(hid_t obj, const char* name) {
  if (H5Aexists(obj, name) <= 0) return {};
  H5Id attr(ok(H5Aopen(obj, name, H5P_DEFAULT), std::string("no attribute ") + name));
  H5Id space(ok(H5Aget_space(attr), "H5Aget_space"));
  std::vector<int64_t> v((size_t)H5Sget_simple_extent_npoints(space));
  ok(H5Aread(attr, H5T_NATIVE_INT64, v.data()), std::string("cannot read attribute ") + name);
  return std::vector<int>(v.begin(), v.end());
}

// A list of fp32 values, stored as fp32 (bit for bit); an absent one reads as empty.
inline void write_attr_floats(hid_t obj, const char* name, const std::vector<float>& values) {
  const hsize_t n = values.size();
  H5Id space(ok(H5Screate_simple(1, &n, nullptr), "H5Screate_simple"));
  H5Id attr(ok(H5Acreate2(obj, name, H5T_IEEE_F32LE, space, H5P_DEFAULT, H5P_DEFAULT),
               std::string("cannot create attribute ") + name));
  ok(H5Awrite(attr, H5T_NATIVE_FLOAT, values.data()), std::string("cannot write attribute ") + name);
}

inline std::vector<float> read_attr_floats_or_empty(hid_t obj, const char* name) {
  if (H5Aexists(obj, name) <= 0) return {};
  H5Id attr(ok(H5Aopen(obj, name, H5P_DEFAULT), std::string("no attribute ") + name));
  H5Id space(ok(H5Aget_space(attr), "H5Aget_space"));
  std::vector<float> v((size_t)H5Sget_simple_extent_npoints(space));
  ok(H5Aread(attr, H5T_NATIVE_FLOAT, v.data()), std::string("cannot read attribute ") + name);
  return v;
}

inline hid_t utf8_string_type() {
  hid_t t = ok(H5Tcopy(H5T_C_S1), "H5Tcopy");
  ok(H5Tset_size(t, H5T_VARIABLE), "H5Tset_size");
  ok(H5Tset_cset(t, H5T_CSET_UTF8), "H5Tset_cset");
  return t;
}

inline void write_string(hid_t file, const char* name, const std::string& text) {
  H5Id type(utf8_string_type());
  H5Id space(ok(H5Screate(H5S_SCALAR), "H5Screate"));
  H5Id ds(ok(H5Dcreate2(file, name, type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
             std::string("cannot create ") + name));
  const char* p = text.c_str();
  ok(H5Dwrite(ds, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, &p), std::string("cannot write ") + name);
}

inline hid_t create_group(hid_t parent, const char* name) {
  H5Id lcpl(link_props());
  return ok(H5Gcreate2(parent, name, lcpl, H5P_DEFAULT, H5P_DEFAULT),
            std::string("cannot create group ") + name);
}

inline std::string unit_dataset(StateKind kind, size_t unit) {
  return std::string(state_kind_name(kind)) + "/unit_" + std::to_string(unit);
}

// Every state a rank file can hold, in file order (DiLoCo's outer state only with islands).
constexpr StateKind kAllKinds[] = {StateKind::Master, StateKind::AdamM, StateKind::AdamV,
                                   StateKind::OuterSync, StateKind::OuterMomentum};


// The dataset shape of logical tensor t (hdf5_format.h): (rows, cols), (rows,) for a vector, and
// a leading experts axis for a stacked tensor: (E, rows/E, cols), (E, rows/E).
inline std::vector<hsize_t> dataset_dims(const TensorPlacement& t) {
  std::vector<hsize_t> dims;
  if (t.stacked > 1) dims.push_back((hsize_t)t.stacked);
  dims.push_back((hsize_t)(t.rows / t.stacked));
  if (t.cols > 1) dims.push_back((hsize_t)t.cols);
  return dims;
}

inline std::string shape_text(const std::vector<hsize_t>& dims) {
  std::string s = "(";
  for (size_t i = 0; i < dims.size(); i++) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + ")";
}

// Selects block b of logical tensor t in `space` (shaped as dataset_dims(t)): global row b.row
// of a stacked tensor is row b.row % (rows/E) of expert b.row / (rows/E).
inline void select_block(hid_t space, const TensorPlacement& t, const Block& b) {
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

}  // namespace h5
